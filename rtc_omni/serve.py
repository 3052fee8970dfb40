"""One server process until it is told to stop: the only one, one of --workers, or the vLLM engine process.

Its own module, below the CLI, so that the engine process runs it without importing the CLI."""

from __future__ import annotations

import asyncio
import errno
import socket
import sys
from collections.abc import Callable

from .app import create_app, serve
from .config import Settings
from .engines.vllm_runtime import EngineUnavailable
from .event_loop import EventLoopUnavailable, loop_factory
from .workers import Worker


def serve_process(settings: Settings, worker: Worker | None, on_listening: Callable[[int], None]) -> int:
    """Run one server process (the only one, or one of --workers) until it is told to stop."""
    try:
        factory = loop_factory(settings.event_loop)
    except EventLoopUnavailable as exc:
        return refused(exc)
    app = create_app(settings, worker=worker)
    try:
        with asyncio.Runner(loop_factory=factory) as runner:
            runner.run(serve(app, settings, on_listening=on_listening, worker=worker))
    except EngineUnavailable as exc:
        return refused(exc)
    except OSError as exc:
        return refused(listen_error(exc, settings.host, settings.port))
    return 0


def refused(reason: object) -> int:
    """Say why the server did not start, as the CLI says it; the exit status for that."""
    print(f"rtc-omni: {reason}", file=sys.stderr)
    return 2


def listen_error(exc: OSError, host: str, port: int) -> str:
    """Why the server could not listen, and what to change."""
    where = f"{host}:{port}"
    if exc.errno == errno.EADDRINUSE:
        return f"{where} is already in use (another rtc-omni serve?): stop it, or pick another --port (0: any free one)"
    if exc.errno == errno.EACCES:
        return f"cannot listen on {where}: permission denied (ports below 1024 need privileges); pick another --port"
    if isinstance(exc, socket.gaierror) or exc.errno == errno.EADDRNOTAVAIL:
        return f"cannot listen on {where}: {exc.strerror or exc}; --host must be an address of this machine"
    return f"cannot listen on {where}: {exc}"
