"""`--engine vllm --workers N`: one engine process holds the model, and the workers reach it as a remote
engine reaches an upstream.

A model is loaded once (minutes and most of a GPU's memory), so N workers cannot each hold one. The
parent starts this module's `main` in a process of its own before it forks the workers: that process
is `rtc-omni serve --engine vllm --workers 1` with the server's own settings (so --model, --device,
--deploy-config, --stage-overrides and --engine-arg build the engine exactly as in a single process,
CPU deploy settings included), listening on 127.0.0.1 only, on a port it picks itself and reports
back on a pipe once the model is loaded. Each worker then runs the remote engine against
`ws://127.0.0.1:PORT`, over vLLM-Omni's WebSocket protocol (docs/deployment.md, "One model for all
the workers").

The settings go to the child as JSON on its stdin (not its command line, where `ps` would show any
secret in them); the child runs in a session of its own, so the parent stops it after the workers.
Its port is open to every process on the host, so it takes only a token drawn for this run, which
reaches the workers in memory (as their --upstream-api-key); without it a local process could use
the model past every limit and token of the server.
"""

from __future__ import annotations

import json
import logging
import os
import secrets
import select
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable

from ..config import Settings
from ..logs import configure_logging
from ..serve import serve_process
from .processes import describe_exit, die_with_parent

logger = logging.getLogger(__name__)

# Not `-m`: imported by name, the module stays one copy whatever the package imports first (runpy's warning).
ENTRY = "import sys; from rtc_omni.workers.engine_process import main; sys.exit(main())"
LOOPBACK = "127.0.0.1"
STOP_GRACE_S = 60.0  # vLLM-Omni's stage processes take 15-20 s to stop on a busy CPU
HEALTH_INTERVAL_S = 5.0
HEALTH_TIMEOUT_S = 2.0
POLL_S = 0.5


# Straight to 127.0.0.1, whatever http_proxy says.
_DIRECT = urllib.request.build_opener(urllib.request.ProxyHandler({}))


class EngineStartError(RuntimeError):
    """The engine process exited or did not get ready in time; the message says which."""


def engine_settings(settings: Settings, workers: int, token: str) -> Settings:
    """The engine process's settings: one process on 127.0.0.1, whose clients are the workers, each
    presenting `token`.

    Every session reaches it from 127.0.0.1, so the per-client limits would count all of them as one
    client; twice --max-sessions leaves room for a session whose old socket is still closing while it
    opens a new one (an interrupt does that); each worker's two upstream pools keep a health-check
    connection each, and the parent checks it too. The workers check the clients' tokens; the ICE
    ports are theirs, and so is the place in a fleet (the engine process is no gateway)."""
    sessions = 2 * settings.max_sessions
    return settings.model_copy(
        update={
            "host": LOOPBACK,
            "port": 0,
            "workers": "1",
            "auth_token": token,
            "session_rate_limit": 0,
            "max_sessions": sessions,
            "max_connections_per_client": sessions + 2 * workers + 1,
            "ice_port_min": None,
            "ice_port_max": None,
            "node_id": None,
            "peer": [],
            "cluster_key": None,
        }
    )


def remote_settings(settings: Settings, url: str, token: str) -> Settings:
    """A worker's settings: the remote engine, with the engine process as its one upstream."""
    return settings.model_copy(update={"engine": "remote", "upstream": [url], "upstream_api_key": token})


class EngineProcess:
    """The engine process of `--engine vllm --workers N`, as the parent sees it."""

    def __init__(self, settings: Settings, workers: int) -> None:
        self.token = secrets.token_urlsafe(32)  # what the workers present to it
        ready_reader, ready_writer = os.pipe()
        try:
            self.process = subprocess.Popen(
                [sys.executable, "-c", ENTRY, str(ready_writer)],
                stdin=subprocess.PIPE,
                pass_fds=(ready_writer,),
                start_new_session=True,  # Ctrl-C reaches the workers; the parent stops this after them
            )
        finally:
            os.close(ready_writer)
        self._ready = ready_reader
        assert self.process.stdin is not None
        try:
            with self.process.stdin as stdin:
                stdin.write(engine_settings(settings, workers, self.token).model_dump_json().encode())
        except BrokenPipeError:
            pass  # it died at once: wait_ready says so
        self.url: str | None = None
        self._next_health_check = 0.0

    @property
    def pid(self) -> int:
        return self.process.pid

    def wait_ready(self, timeout_s: float, stopping: Callable[[], bool]) -> str | None:
        """The engine's `ws://` URL once its model is loaded and it listens; None when `stopping()`
        turned true first. EngineStartError when it exits first or takes longer than `timeout_s`."""
        deadline = time.monotonic() + timeout_s
        received = b""
        try:
            while not stopping():
                if self.process.poll() is not None:
                    raise EngineStartError(
                        f"the vLLM engine process {describe_exit(self.process.returncode)} before it was ready "
                        "(its log lines above say why)"
                    )
                if time.monotonic() > deadline:
                    raise EngineStartError(
                        f"the vLLM engine process was not ready within --engine-start-timeout ({timeout_s:g} s); "
                        "raise it for a model that loads slower"
                    )
                if select.select([self._ready], [], [], POLL_S)[0]:
                    chunk = os.read(self._ready, 64)
                    if not chunk:  # it closed the pipe: it is exiting
                        time.sleep(POLL_S)
                    received += chunk
                    if received.endswith(b"\n"):
                        self.url = f"ws://{LOOPBACK}:{int(received)}"
                        logger.info("vLLM engine process (pid %d) ready at %s", self.pid, self.url)
                        self._next_health_check = time.monotonic() + HEALTH_INTERVAL_S
                        return self.url
            return None
        finally:
            os.close(self._ready)

    def failure(self) -> str | None:
        """Why the engine can serve no more (it exited, or says it is unhealthy), or None. Checks its
        health endpoint at most every HEALTH_INTERVAL_S; an answer that is slow or missing is not a
        failure (a busy engine), only an exit or a 503 is: a dead vLLM-Omni stage stays dead."""
        if self.process.poll() is not None:
            return f"vLLM engine process (pid {self.pid}) {describe_exit(self.process.returncode)}"
        if self.url is None or time.monotonic() < self._next_health_check:
            return None
        self._next_health_check = time.monotonic() + HEALTH_INTERVAL_S
        try:
            with _DIRECT.open(self.url.replace("ws://", "http://") + "/health", timeout=HEALTH_TIMEOUT_S):
                return None
        except urllib.error.HTTPError as exc:
            if exc.code != 503:
                return None
            try:
                detail = json.loads(exc.read(4096)).get("detail")
            except (ValueError, AttributeError):
                detail = None
            return f"vLLM engine process (pid {self.pid}) is unhealthy: {detail or 'its /health answers 503'}"
        except (OSError, ValueError):
            return None

    def stop(self) -> None:
        """SIGTERM, up to STOP_GRACE_S to exit, then SIGKILL to what is left of its process group:
        stage processes it left behind (it was killed while loading, say), or all of it after the grace."""
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(STOP_GRACE_S)
            except subprocess.TimeoutExpired:
                logger.error(
                    "vLLM engine process (pid %d) did not stop within %g s; killing it", self.pid, STOP_GRACE_S
                )
        try:
            os.killpg(self.pid, signal.SIGKILL)  # its own session's group: only what it started
        except ProcessLookupError:
            pass  # nothing left
        self.process.wait()


def main() -> int:
    """The engine process: serve the settings on stdin; write the port to the fd in argv[1] once ready."""
    die_with_parent()
    ready = int(sys.argv[1])
    settings = Settings.model_validate_json(sys.stdin.read())
    configure_logging(settings.log_level, settings.log_format)
    # Its clients are the workers (their health checks every few seconds): the workers log the real ones.
    logging.getLogger("aiohttp.access").setLevel(logging.WARNING)

    def listening(port: int) -> None:
        os.write(ready, f"{port}\n".encode())
        os.close(ready)

    return serve_process(settings, None, listening)
