"""The aiohttp application: routes, shared state, startup and shutdown."""

from __future__ import annotations

import logging
from pathlib import Path

from aiohttp import web

from .config import Settings
from .engines import UnderstandEngine, create_engine
from .sessions.registry import SessionRegistry
from .signaling import offer
from .signaling.ice import set_host_addresses
from .signaling.keys import ENGINE, REGISTRY, SETTINGS

logger = logging.getLogger(__name__)

STATIC_DIR = Path(__file__).resolve().parent.parent / "static"


async def healthz(request: web.Request) -> web.Response:
    settings = request.app[SETTINGS]
    return web.json_response(
        {"status": "ok", "engine": settings.engine, "model": settings.model, "sessions": len(request.app[REGISTRY])}
    )


async def _close_sessions(app: web.Application) -> None:
    await app[REGISTRY].close_all()


async def _close_engine(app: web.Application) -> None:
    await app[ENGINE].close()


def create_app(settings: Settings, engine: UnderstandEngine | None = None) -> web.Application:
    """Build the server. `engine` overrides the one the settings name (tests pass their own)."""
    set_host_addresses(None if settings.gather_all_interfaces else settings.ice_address)
    app = web.Application(client_max_size=offer.MAX_OFFER_BYTES)
    app[SETTINGS] = settings
    app[ENGINE] = engine if engine is not None else create_engine(settings)
    app[REGISTRY] = SessionRegistry(settings.max_sessions)
    app.router.add_get("/healthz", healthz)
    offer.add_routes(app)
    if (STATIC_DIR / "index.html").is_file():
        app.router.add_get("/", lambda _request: web.FileResponse(STATIC_DIR / "index.html"))
        app.router.add_static("/static/", STATIC_DIR)
    app.on_shutdown.append(_close_sessions)
    app.on_cleanup.append(_close_engine)
    return app
