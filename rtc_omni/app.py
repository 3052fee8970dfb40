"""The aiohttp application: routes, shared state, startup and shutdown."""

from __future__ import annotations

import logging
from pathlib import Path

from aiohttp import web

from .config import Settings
from .engines import Engines, create_engines
from .sessions.recordings import RecordingStore
from .sessions.registry import SessionRegistry
from .signaling import ice, offer, whep, whip
from .signaling.auth import bearer_auth
from .signaling.ice import set_host_addresses, set_port_range
from .signaling.keys import ENGINES, RECORDINGS, REGISTRY, SETTINGS

logger = logging.getLogger(__name__)

# The browser client (plain HTML, CSS and JS modules) lives in the repository's top-level static/
# folder, found from this package so that it works from any working directory.
STATIC_DIR = Path(__file__).resolve().parent.parent / "static"


async def healthz(request: web.Request) -> web.Response:
    settings = request.app[SETTINGS]
    return web.json_response(
        {
            "status": "ok",
            "engine": settings.engine,
            "model": settings.model,
            "kinds": request.app[ENGINES].kinds,
            "sessions": len(request.app[REGISTRY]),
        }
    )


async def index(request: web.Request) -> web.FileResponse:
    return web.FileResponse(STATIC_DIR / "index.html", headers={"Cache-Control": "no-cache"})


def add_browser_client(app: web.Application) -> None:
    """`GET /` serves the browser page, `/static/` its assets (skipped when static/ is absent)."""
    if not (STATIC_DIR / "index.html").is_file():
        logger.info("no browser client at %s; / is not served", STATIC_DIR)
        return
    app.router.add_get("/", index)
    app.router.add_static("/static/", STATIC_DIR)


async def _close_sessions(app: web.Application) -> None:
    await app[REGISTRY].close_all()


async def _close_engines(app: web.Application) -> None:
    await app[ENGINES].close()
    app[RECORDINGS].close()


def create_app(settings: Settings, engines: Engines | None = None) -> web.Application:
    """Build the server. `engines` overrides the ones the settings name (tests pass their own)."""
    set_host_addresses(None if settings.gather_all_interfaces else settings.ice_address)
    set_port_range(settings.ice_ports)
    middlewares = [bearer_auth(settings.auth_token)] if settings.auth_token else []
    app = web.Application(client_max_size=offer.MAX_OFFER_BYTES, middlewares=middlewares)
    app[SETTINGS] = settings
    app[ENGINES] = engines if engines is not None else create_engines(settings)
    app[REGISTRY] = SessionRegistry(settings.max_sessions)
    app[RECORDINGS] = RecordingStore(settings.recording_dir, settings.max_recordings)
    app.router.add_get("/healthz", healthz)
    offer.add_routes(app)
    add_browser_client(app)
    whip.add_routes(app)
    whep.add_routes(app)
    app.router.add_get("/v1/ice-servers", ice.get_ice_servers)
    app.on_shutdown.append(_close_sessions)
    app.on_cleanup.append(_close_engines)
    return app
