"""Typed application keys for what the handlers share."""

from __future__ import annotations

from typing import Protocol

from aiohttp import web

from ..config import Settings
from ..drain import Drain
from ..engines import Engines
from ..sessions.recordings import RecordingStore
from ..sessions.registry import SessionRegistry

SETTINGS = web.AppKey("settings", Settings)
ENGINES = web.AppKey("engines", Engines)
REGISTRY = web.AppKey("registry", SessionRegistry)
RECORDINGS = web.AppKey("recordings", RecordingStore)
DRAIN = web.AppKey("drain", Drain)


class SocketRelay(Protocol):
    """With --workers or a fleet: carries a WebSocket whose session another process owns to that
    process (workers/forwarding.py); a resume names its session only in its first message."""

    async def relay_websocket(
        self, request: web.Request, ws: web.WebSocketResponse, first: str, session_id: str
    ) -> bool:
        """Relay `ws` (its `first` message already read) to the owner of `session_id` until either side
        closes; False when this process is the owner, or nobody is."""
        ...


SOCKET_RELAY = web.AppKey("socket_relay", SocketRelay)
