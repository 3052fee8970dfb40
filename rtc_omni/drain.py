"""Drain mode: stop taking sessions, let the live ones end, then exit 0, so a rolling restart cuts no call.

SIGUSR2, or `POST /v1/admin/drain` (signaling/admin.py), starts it: /healthz answers 503, so the load
balancer sends new clients elsewhere, and every new session is refused with 503 + Retry-After, while
the open ones (and their viewers and controllers) go on. Once the last one ends, or --drain-timeout
after the start, the server stops as on SIGTERM: the sessions still open hear why and are closed.
With --workers the parent passes SIGUSR2 to every worker, and exits 0 once they all did
(workers/supervisor.py). docs/deployment.md, "Drain mode".
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import time

from .sessions.registry import SessionRegistry

logger = logging.getLogger(__name__)

DRAIN_SIGNAL = signal.SIGUSR2
DRAINING = "this server is draining: open the session on another"
POLL_S = 0.2  # how often a draining server looks whether its last session ended


class Drain:
    """One server process's drain: started once, over once its sessions ended or its time is up."""

    def __init__(self, registry: SessionRegistry, timeout_s: float, parent_pid: int | None = None) -> None:
        self.registry = registry
        self.timeout_s = timeout_s
        self.parent_pid = parent_pid  # a worker's parent, which drains every worker
        self.started_at: float | None = None
        self._started = asyncio.Event()

    @property
    def draining(self) -> bool:
        return self.started_at is not None

    def request(self) -> None:
        """Drain the whole server: this process, or with --workers every worker, through their parent."""
        if self.parent_pid is not None:
            os.kill(self.parent_pid, DRAIN_SIGNAL)
        else:
            self.start()

    def start(self) -> None:
        """Refuse new sessions from now on (again: nothing changes)."""
        if self.started_at is not None:
            return
        self.started_at = time.monotonic()
        self.registry.refuse_new(DRAINING)
        self._started.set()
        logger.warning(
            "draining: refusing new sessions; exiting once the %d open end, or in %g s (--drain-timeout)",
            len(self.registry),
            self.timeout_s,
        )

    async def over(self) -> None:
        """Returns once a drain started and every session of this process ended, or its time ran out."""
        await self._started.wait()
        deadline = time.monotonic() + self.timeout_s
        while len(self.registry) and time.monotonic() < deadline:
            await asyncio.sleep(POLL_S)
        if len(self.registry):
            logger.warning("drain timeout: closing the %d sessions still open", len(self.registry))
        else:
            logger.info("drained: every session ended; stopping")
