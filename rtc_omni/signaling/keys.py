"""Typed application keys for what the handlers share."""

from __future__ import annotations

from aiohttp import web

from ..config import Settings
from ..engines.base import UnderstandEngine
from ..sessions.registry import SessionRegistry

SETTINGS = web.AppKey("settings", Settings)
ENGINE = web.AppKey("engine", UnderstandEngine)
REGISTRY = web.AppKey("registry", SessionRegistry)
