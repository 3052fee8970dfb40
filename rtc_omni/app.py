"""The aiohttp application: routes, shared state, startup and shutdown."""

from __future__ import annotations

import asyncio
import logging
import os
import signal
from collections.abc import Callable
from pathlib import Path

from aiohttp import web

from . import patches
from .allocations import AllocationReport
from .config import Settings
from .drain import DRAIN_SIGNAL, Drain
from .engines import Engines, create_engines
from .fleet import Fleet
from .heap import ClosedSessionCollector, freeze_startup_heap
from .metrics import get_metrics, watch_sessions
from .sessions.recordings import RecordingStore
from .sessions.registry import SessionRegistry
from .signaling import admin, client_secrets, ice, offer, realtime_calls, websocket, whep, whip
from .signaling.capabilities import (
    SESSION_TOKENS,
    RedactingAccessLogger,
    SessionTokens,
    checks_its_own_access,
    server_token_auth,
)
from .signaling.keys import DRAIN, ENGINES, RECORDINGS, REGISTRY, SETTINGS, SOCKET_RELAY
from .signaling.limits import ConnectionLimit, cors_allow_list, session_rate_limit, text_body
from .signaling.public_url import TrustedProxies, public_url_middleware
from .tls import server_ssl_context
from .workers import Worker
from .workers.forwarding import REDEEM_PATH, OwnerRouting, forwarded_client_address, session_id_prefix
from .workers.shared_port import bind_shared_port

logger = logging.getLogger(__name__)

# The browser client (plain HTML, CSS and JS modules) lives in the repository's top-level static/
# folder, found from this package so that it works from any working directory.
STATIC_DIR = Path(__file__).resolve().parent.parent / "static"


async def healthz(request: web.Request) -> web.Response:
    """200 while every served kind works; 503 with the reason once an engine broke for good, or while
    the server drains (drain.py), so that a load balancer sends new clients elsewhere."""
    settings = request.app[SETTINGS]
    engines = request.app[ENGINES]
    problem = await engines.health()
    draining = request.app[DRAIN].draining
    body: dict[str, object] = {
        "status": "draining" if draining else "ok" if problem is None else "unhealthy",
        "engine": settings.engine,
        "model": settings.model,
        "kinds": engines.kinds,
        "sessions": request.app[REGISTRY].open_in_server(),  # with --workers, the whole node's
    }
    if problem is not None:
        body["detail"] = problem
    return web.json_response(body, status=200 if problem is None and not draining else 503)


async def index(request: web.Request) -> web.FileResponse:
    return web.FileResponse(STATIC_DIR / "index.html", headers={"Cache-Control": "no-cache"})


def add_browser_client(app: web.Application) -> None:
    """`GET /` serves the browser page, `/static/` its assets (skipped when static/ is absent)."""
    if not (STATIC_DIR / "index.html").is_file():
        logger.info("no browser client at %s; / is not served", STATIC_DIR)
        return
    app.router.add_get("/", index)
    app.router.add_static("/static/", STATIC_DIR)


SHUTDOWN_MESSAGE = "Server shutting down"


async def _close_sessions(app: web.Application) -> None:
    """Ctrl-C / SIGTERM: every session hears why, then is closed (its last events drained first)."""
    registry = app[REGISTRY]
    for session_id in registry:
        live = registry.get(session_id)
        session = getattr(live, "session", None)
        if session is not None:
            session.notify(SHUTDOWN_MESSAGE)
    await registry.close_all()


async def _close_engines(app: web.Application) -> None:
    await app[ENGINES].close()
    app[RECORDINGS].close()


async def _start_engines(app: web.Application) -> None:
    """Load the engines at startup (a GPU model takes a while) into the app's Engines holder."""
    built = await create_engines(app[SETTINGS])
    app[ENGINES].understand, app[ENGINES].generate = built.understand, built.generate


def create_app(settings: Settings, engines: Engines | None = None, worker: Worker | None = None) -> web.Application:
    """Build the server. `engines` overrides the ones the settings name (tests pass their own);
    `worker`: this process is one of `--workers N` (workers/); with --node-id it is a node of a fleet (fleet/)."""
    patches.apply(None if settings.gather_all_interfaces else settings.ice_address, settings.ice_ports)
    fleet = Fleet.of(settings)
    middlewares = [] if worker is None and fleet is None else [forwarded_client_address(fleet)]
    if settings.trusted_proxy:  # before anything that reads the request's URL
        middlewares.append(public_url_middleware(TrustedProxies(settings.trusted_proxy)))
    if settings.cors_origin:
        middlewares.append(cors_allow_list(settings.cors_origin))
    if settings.session_rate_limit:  # before the keys: a refused request does not use up its ephemeral key
        middlewares.append(session_rate_limit(settings.session_rate_limit))
    id_prefix = session_id_prefix(worker, fleet)
    keys = client_secrets.EphemeralKeys(owner_prefix=id_prefix)
    routing = None if worker is None and fleet is None else OwnerRouting(keys, worker, fleet)
    middlewares.append(client_secrets.ephemeral_auth(client_secrets.OwnKeys(keys) if routing is None else routing))
    if settings.auth_token:
        middlewares.append(server_token_auth())
    middlewares.append(text_body(settings.http_body_timeout))
    if routing is not None:  # innermost: the body is read, the caller's address counted, by now
        middlewares.append(routing.middleware())
    app = web.Application(
        client_max_size=offer.MAX_OFFER_BYTES,
        middlewares=middlewares,
        # aiohttp closes a connection that sends no complete request within its keep-alive timeout:
        # that is also the deadline for a request's headers (a client dribbling them).
        handler_args={"keepalive_timeout": settings.http_idle_timeout},
    )
    app[SETTINGS] = settings
    if routing is not None:
        app[SOCKET_RELAY] = routing
    # One key for every process that may check a token: the fleet's, else the workers' (None: drawn here).
    token_key = fleet.token_key if fleet is not None else None
    if token_key is None and worker is not None:
        token_key = worker.token_key
    app[SESSION_TOKENS] = SessionTokens(token_key)
    app[ENGINES] = engines if engines is not None else Engines()
    if engines is None:
        app.on_startup.append(_start_engines)
    slots = None if worker is None else worker.slots
    app[REGISTRY] = SessionRegistry(settings.max_sessions, slots, id_prefix, ClosedSessionCollector().session_closed)
    app[DRAIN] = Drain(app[REGISTRY], settings.drain_timeout, None if worker is None else os.getppid())
    app[RECORDINGS] = RecordingStore(settings.recording_dir, settings.max_recordings, settings.max_recording_bytes)
    watch_sessions(app[REGISTRY])
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/health", healthz)  # vLLM's name, so a gateway can health-check another rtc-omni
    app.router.add_get("/metrics", get_metrics)
    offer.add_routes(app)
    add_browser_client(app)
    whip.add_routes(app)
    whep.add_routes(app)
    websocket.add_routes(app)
    realtime_calls.add_routes(app)
    client_secrets.add_routes(app, keys)
    admin.add_routes(app)
    app.router.add_get("/v1/ice-servers", ice.get_ice_servers)
    app.on_shutdown.append(_close_sessions)
    app.on_cleanup.append(_close_engines)
    if routing is not None:
        app.router.add_post(REDEEM_PATH, checks_its_own_access(routing.redeem_for_owner))
        app.router.add_put(REDEEM_PATH, checks_its_own_access(routing.give_back_for_owner))
        app.on_cleanup.append(routing.close)
    return app


SHUTDOWN_TIMEOUT_S = 10.0


async def _until_stopped(stop: asyncio.Event, drain: Drain) -> None:
    """Wait for SIGINT or SIGTERM (`stop`), or for the end of a drain."""
    waiters = [asyncio.ensure_future(stop.wait()), asyncio.ensure_future(drain.over())]
    try:
        await asyncio.wait(waiters, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for waiter in waiters:
            waiter.cancel()


async def serve(
    app: web.Application,
    settings: Settings,
    on_listening: Callable[[int], None] | None = None,
    worker: Worker | None = None,
) -> None:
    """Serve `app` on --host/--port (HTTPS with --tls-cert) until SIGINT or SIGTERM, or the end of a
    drain (SIGUSR2: drain.py), then shut down gracefully (SIGUSR1 logs the top allocation sites:
    allocations.py); `on_listening` gets the bound port once the engines are up and the server listens
    (the CLI's ready banner).
    A `worker` shares the port with its siblings (SO_REUSEPORT) and also listens on its private
    Unix socket for the requests they forward to it (workers/forwarding.py).

    aiohttp's run_app, plus the cap on connections per client address (ConnectionLimit), which
    needs the listening socket's protocol factory.
    """
    runner = web.AppRunner(app, shutdown_timeout=SHUTDOWN_TIMEOUT_S, access_log_class=RedactingAccessLogger)
    await runner.setup()  # the engines are loaded
    freeze_startup_heap()
    assert runner.server is not None
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, stop.set)
    loop.add_signal_handler(signal.SIGUSR1, AllocationReport().log_soon)  # the leak hunter's probe
    loop.add_signal_handler(DRAIN_SIGNAL, app[DRAIN].start)
    limited = ConnectionLimit(runner.server, settings.max_connections_per_client)
    tls = None
    if settings.tls_cert is not None and settings.tls_key is not None:
        tls = server_ssl_context(settings.tls_cert, settings.tls_key)
    listeners: list[asyncio.Server] = []
    try:
        if worker is None:
            listeners.append(await loop.create_server(limited, settings.host, settings.port, ssl=tls))
        else:
            shared = bind_shared_port(settings.host, settings.port)
            listeners.append(await loop.create_server(limited, sock=shared, ssl=tls))
            listeners.append(await loop.create_unix_server(runner.server, str(worker.socket_path(worker.index))))
        if on_listening is not None:
            on_listening(listeners[0].sockets[0].getsockname()[1])
        await _until_stopped(stop, app[DRAIN])
    finally:
        for listener in listeners:
            listener.close()
        await runner.cleanup()
