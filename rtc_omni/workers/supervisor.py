"""The parent of `rtc-omni serve --workers N`: bind the port, fork the workers, watch them.

The parent binds the HTTP port first (SO_REUSEPORT, without listening), so `--port 0` has a real
port to print and to hand down, and keeps it bound while the workers listen on it. It forks before
any event loop or aiortc object exists: each worker builds its own. It makes the state the workers
share: the session-token key, the session counts (slots.py) and the folder of their Unix sockets.

A worker that dies takes its sessions' media with it, and only its own: the parent logs which one
died and how, frees its session slots and starts it again (restarts.py), unless it keeps dying
soon after its start: then the parent stops the others and exits non-zero, for the service manager
(systemd, Kubernetes) to deal with. SIGTERM/SIGINT are passed on to the workers, which close their
sessions as a single server does; so is SIGUSR2, a drain (drain.py): the parent then restarts no
worker, and exits 0 once every worker finished its sessions and exited.

With --engine vllm the model is loaded once, in an engine process the parent starts before the
workers and stops after them; the workers reach it as a remote engine reaches an upstream
(engine_process.py). When it exits, or says it is unhealthy, the parent does the same as for a
worker that keeps dying, 5 s later (so that the turns in flight can say why they failed): it stops
the workers and exits non-zero.
"""

from __future__ import annotations

import logging
import multiprocessing
import multiprocessing.connection
import os
import secrets
import shutil
import signal
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from types import FrameType

from ..config import Settings
from ..drain import DRAIN_SIGNAL
from .engine_process import EngineProcess, remote_settings
from .identity import Worker
from .processes import die_with_parent
from .restarts import POLL_S, Workers
from .shared_port import bind_shared_port
from .slots import SessionSlots

logger = logging.getLogger(__name__)

# What the CLI runs in each worker: settings, the worker, the callback once it listens -> exit status.
ServeWorker = Callable[[Settings, Worker, Callable[[int], None]], int]
STOP_GRACE_S = 15.0  # a worker's own shutdown takes up to app.SHUTDOWN_TIMEOUT_S (10 s)
# After the engine failed, before the workers stop: time for the turns in flight to fail with the
# engine's reason, which their clients would not hear from a worker that is shutting down.
ENGINE_FAILURE_GRACE_S = 5.0


def worker_settings(settings: Settings, index: int, count: int, port: int) -> Settings:
    """A worker's settings: the port the parent bound, and its own share of the ICE port range."""
    update: dict[str, object] = {"port": port}
    ports = settings.ice_ports
    if ports is not None:
        share = len(ports) // count  # config.py refuses a range smaller than the worker count
        low = ports.start + index * share
        update["ice_port_min"] = low
        update["ice_port_max"] = ports.stop - 1 if index == count - 1 else low + share - 1
    return settings.model_copy(update=update)


def _worker_main(
    serve_worker: ServeWorker, settings: Settings, worker: Worker, ready: multiprocessing.connection.Connection
) -> None:
    for signum in (signal.SIGINT, signal.SIGTERM):  # the parent's handlers are not this process's
        signal.signal(signum, signal.SIG_DFL)
    signal.signal(DRAIN_SIGNAL, signal.SIG_IGN)  # until its event loop drains on it (app.serve)
    die_with_parent()  # a parent killed outright (SIGKILL) takes its workers with it
    sys.exit(serve_worker(settings, worker, lambda _port: ready.send(worker.index)))


def run_workers(settings: Settings, serve_worker: ServeWorker, on_listening: Callable[[int], None]) -> int:
    """Serve with `settings.worker_count` workers until SIGTERM/SIGINT or a drain's end (0), or until a worker keeps
    dying or the engine process dies (non-zero). With --engine vllm the engine process starts, and
    loads its model, before the workers are forked (engine_process.py).

    Raises OSError when the port cannot be bound, EngineStartError when the engine does not start."""
    count = settings.worker_count
    port_holder = bind_shared_port(settings.host, settings.port)
    port = port_holder.getsockname()[1]
    socket_dir = Path(tempfile.mkdtemp(prefix="rtc-omni-workers-"))  # mode 0700: this user's only
    context = multiprocessing.get_context("fork")
    ready_reader, ready_writer = context.Pipe(duplex=False)
    slots = SessionSlots(count)
    token_key = secrets.token_bytes(32)
    engine: EngineProcess | None = None
    workers = Workers(slots)
    # Signals are recorded from here on, so that a stop request never cuts the start or the cleanup short
    # (a drain request is passed on to the workers once they run).
    with _recorded(signal.SIGINT, signal.SIGTERM) as stopping, _recorded(DRAIN_SIGNAL) as draining:
        try:
            if settings.engine == "vllm":  # one model for all the workers
                engine = EngineProcess(settings, count)
                url = engine.wait_ready(settings.engine_start_timeout, lambda: bool(stopping))
                if url is None:
                    logger.info("%s before the engine was ready: stopping it", signal.Signals(stopping[0]).name)
                    return 0
                settings = remote_settings(settings, url, engine.token)

            def start_worker(index: int) -> multiprocessing.process.BaseProcess:
                worker = Worker(index, count, socket_dir, token_key, slots.owned_by(index))
                process = context.Process(
                    target=_worker_main,
                    args=(serve_worker, worker_settings(settings, index, count, port), worker, ready_writer),
                    name=f"rtc-omni-worker-{index}",
                )
                process.start()
                return process

            workers.start_all(start_worker, count)
            return _supervise(workers, engine, ready_reader, stopping, draining, lambda: on_listening(port))
        finally:
            _stop(workers.processes)
            if engine is not None:
                engine.stop()
            shutil.rmtree(socket_dir, ignore_errors=True)
            port_holder.close()


@contextmanager
def _recorded(*signums: int) -> Iterator[list[int]]:
    """Within the block the signals are recorded in the list, not acted on."""
    received: list[int] = []

    def record(signum: int, _frame: FrameType | None) -> None:
        received.append(signum)

    previous = {signum: signal.signal(signum, record) for signum in signums}
    try:
        yield received
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


def _supervise(
    workers: Workers,
    engine: EngineProcess | None,
    ready: multiprocessing.connection.Connection,
    stopping: list[int],
    draining: list[int],
    on_all_ready: Callable[[], None],
) -> int:
    """Watch the workers and the engine until a stop request lands in `stopping`, or every worker
    exited after a drain request landed in `draining` (0), or a worker keeps dying or the engine
    dies (non-zero). A dead worker is restarted (restarts.py), except while draining."""
    waiting_for = set(range(len(workers.processes)))  # the first start, which the banner waits for
    while not stopping:
        if draining and not workers.draining:
            logger.warning("%s: draining %d workers", signal.Signals(draining[0]).name, len(workers.processes))
            workers.drain()
        if workers.drained:
            logger.info("every worker drained; exiting")
            return 0
        workers.restart_due()
        sentinels = workers.sentinels()
        for event in multiprocessing.connection.wait([ready, *sentinels], timeout=workers.wait_s()):
            if event is not ready:
                if (status := workers.died(sentinels[event])) is not None:  # type: ignore[index]
                    return status
                continue
            index = ready.recv()
            workers.ready(index)
            if waiting_for:
                waiting_for.discard(index)
                if not waiting_for:
                    on_all_ready()
        if engine is not None and (failure := engine.failure()) is not None:
            logger.error("%s; stopping the workers in %g s (every session ends)", failure, ENGINE_FAILURE_GRACE_S)
            _pause(ENGINE_FAILURE_GRACE_S, stopping)
            return 1
    logger.info("%s: stopping %d workers", signal.Signals(stopping[0]).name, len(workers.processes))
    return 0


def _pause(seconds: float, stopping: list[int]) -> None:
    """Sleep for `seconds`, or until a stop request lands in `stopping`."""
    deadline = time.monotonic() + seconds
    while not stopping and (left := deadline - time.monotonic()) > 0:
        time.sleep(min(left, POLL_S))


def _stop(processes: list[multiprocessing.process.BaseProcess]) -> None:
    """SIGTERM to every live worker, then SIGKILL to any still running after STOP_GRACE_S."""
    for process in processes:
        if process.is_alive() and process.pid is not None:
            os.kill(process.pid, signal.SIGTERM)
    deadline = time.monotonic() + STOP_GRACE_S
    for process in processes:
        process.join(max(0.0, deadline - time.monotonic()))
        if process.is_alive():
            logger.error(
                "worker %s (pid %s) did not stop within %g s; killing it", process.name, process.pid, STOP_GRACE_S
            )
            process.kill()
            process.join()
