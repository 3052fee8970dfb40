"""The live sessions of one server, by id, with the concurrency limit."""

from __future__ import annotations

import asyncio
import secrets
from collections.abc import Iterator
from typing import Any, Protocol


class LiveSession(Protocol):
    session_id: str
    kind: str

    async def close(self) -> None: ...

    async def stats(self) -> dict[str, Any]: ...


class SessionLimitReached(Exception):
    """More sessions than `max_sessions` were asked for."""


def new_session_id() -> str:
    """An unguessable id (128 bits from the OS CSPRNG)."""
    return secrets.token_urlsafe(16)


class SessionRegistry:
    def __init__(self, max_sessions: int) -> None:
        self.max_sessions = max_sessions
        self._sessions: dict[str, LiveSession] = {}

    def __len__(self) -> int:
        return len(self._sessions)

    def __iter__(self) -> Iterator[str]:
        return iter(list(self._sessions))

    def __contains__(self, session_id: str) -> bool:
        return session_id in self._sessions

    def check_capacity(self) -> None:
        if len(self._sessions) >= self.max_sessions:
            raise SessionLimitReached(f"session limit of {self.max_sessions} reached")

    def add(self, session: LiveSession) -> None:
        self.check_capacity()
        self._sessions[session.session_id] = session

    def get(self, session_id: str) -> LiveSession | None:
        return self._sessions.get(session_id)

    def remove(self, session_id: str) -> None:
        self._sessions.pop(session_id, None)

    async def close_all(self) -> None:
        await asyncio.gather(*(s.close() for s in list(self._sessions.values())), return_exceptions=True)
        self._sessions.clear()
