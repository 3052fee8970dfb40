"""The live sessions of one server, by id, with the concurrency limit."""

from __future__ import annotations

import asyncio
import secrets
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from ..workers import SessionSlots


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
    """The sessions of this process. With --workers, `slots` counts every worker's sessions against
    `max_sessions`, and `id_prefix` names this worker in the ids it makes; `on_removed` hears of
    each session that ended (heap.py)."""

    def __init__(
        self,
        max_sessions: int,
        slots: SessionSlots | None = None,
        id_prefix: str = "",
        on_removed: Callable[[], None] | None = None,
    ) -> None:
        self.max_sessions = max_sessions
        self.slots = slots
        self.id_prefix = id_prefix
        self.on_removed = on_removed
        self._refusing: str | None = None  # why no new session is taken (drain.py), or None
        self._sessions: dict[str, LiveSession] = {}

    def new_session_id(self) -> str:
        return self.id_prefix + new_session_id()

    def __len__(self) -> int:
        return len(self._sessions)

    def __iter__(self) -> Iterator[str]:
        return iter(list(self._sessions))

    def __contains__(self, session_id: str) -> bool:
        return session_id in self._sessions

    def open_in_server(self) -> int:
        """The sessions open in the whole server: with --workers, every worker's, not only this one's."""
        return len(self._sessions) if self.slots is None else self.slots.total()

    def refuse_new(self, reason: str) -> None:
        """From now on every new session is refused, with `reason` (a draining server: drain.py)."""
        self._refusing = reason

    def check_capacity(self) -> None:
        if self._refusing is not None:
            raise SessionLimitReached(self._refusing)
        if self.open_in_server() >= self.max_sessions:
            raise SessionLimitReached(f"session limit of {self.max_sessions} reached")

    def add(self, session: LiveSession) -> None:
        if self._refusing is not None:
            raise SessionLimitReached(self._refusing)
        if self.slots is None:
            self.check_capacity()
        elif not self.slots.take(self.max_sessions):
            raise SessionLimitReached(f"session limit of {self.max_sessions} reached (across all workers)")
        self._sessions[session.session_id] = session

    def get(self, session_id: str) -> LiveSession | None:
        return self._sessions.get(session_id)

    def remove(self, session_id: str) -> None:
        if self._sessions.pop(session_id, None) is None:
            return
        if self.slots is not None:
            self.slots.release()
        if self.on_removed is not None:
            self.on_removed()

    async def close_all(self) -> None:
        await asyncio.gather(*(s.close() for s in list(self._sessions.values())), return_exceptions=True)
        for session_id in list(self._sessions):
            self.remove(session_id)
