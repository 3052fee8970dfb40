"""Typed application keys for what the handlers share."""

from __future__ import annotations

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
