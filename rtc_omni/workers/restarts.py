"""The workers of `--workers N`, by index: a worker that dies is restarted, within a budget.

A dead worker's sessions are lost (their media lived in it), but its siblings' go on: the parent
frees its session slots and forks a new worker with the same index, so the ids and keys that name
that index reach the new one. A worker that keeps dying soon after its start (a bad setting, a
crash on its first request) is not restarted forever: after RestartBudget's few quick failures in
a row the parent gives up and stops the server, as systemd's start limit or gunicorn's boot error do.
"""

from __future__ import annotations

import logging
import multiprocessing.process
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from ..drain import DRAIN_SIGNAL
from .processes import describe_exit
from .slots import SessionSlots

logger = logging.getLogger(__name__)

POLL_S = 0.5
StartWorker = Callable[[int], multiprocessing.process.BaseProcess]


@dataclass
class RestartBudget:
    """When to restart a dead worker: at once after a failure, with a growing wait after quick
    failures in a row (a worker that died within `quick_failure_s` of its start), never after
    `give_up_after` of them."""

    quick_failure_s: float = 10.0
    give_up_after: int = 3
    backoff_s: float = 1.0
    _in_a_row: dict[int, int] = field(default_factory=dict)

    def delay(self, index: int, lived_s: float) -> float | None:
        """Seconds to wait before restarting worker `index`, which lived `lived_s`; None: give up."""
        in_a_row = self._in_a_row.get(index, 0) + 1 if lived_s < self.quick_failure_s else 0
        self._in_a_row[index] = in_a_row
        if in_a_row >= self.give_up_after:
            return None
        return 0.0 if in_a_row <= 1 else self.backoff_s * 2 ** (in_a_row - 2)


class Workers:
    """The worker processes, by index, as the parent starts, restarts and watches them."""

    def __init__(self, slots: SessionSlots) -> None:
        self._start: StartWorker | None = None
        self._slots = slots
        self._budget = RestartBudget()
        self.processes: list[multiprocessing.process.BaseProcess] = []
        self._started_at: list[float] = []
        self._restart_at: dict[int, float] = {}  # dead workers, by index: when to start them again
        self._died_at: dict[int, float] = {}  # restarted workers not ready yet, by index
        self._drained: set[int] = set()  # workers that exited after a drain, never restarted
        self.draining = False

    def start_all(self, start: StartWorker, count: int) -> None:
        """Start workers 0..count-1 with `start`, which also restarts them."""
        self._start = start
        for index in range(count):
            self.processes.append(start(index))
            self._started_at.append(time.monotonic())

    def sentinels(self) -> dict[int, int]:
        """The live workers' sentinels (readable once the process ended), each to its index."""
        gone = self._restart_at.keys() | self._drained
        return {p.sentinel: i for i, p in enumerate(self.processes) if i not in gone}

    def wait_s(self) -> float:
        """How long the parent may wait for events before a restart is due."""
        due = [at - time.monotonic() for at in self._restart_at.values()]
        return max(0.0, min([POLL_S, *due]))

    def restart_due(self) -> None:
        now = time.monotonic()
        for index in [i for i, at in self._restart_at.items() if at <= now]:
            del self._restart_at[index]
            assert self._start is not None  # a worker died, so they were started
            self.processes[index] = self._start(index)
            self._started_at[index] = now

    def drain(self) -> None:
        """Pass a drain on to every live worker (drain.py); from now on none is restarted."""
        self.draining = True
        self._drained.update(self._restart_at)
        self._restart_at.clear()
        for process in self.processes:
            if process.is_alive() and process.pid is not None:
                os.kill(process.pid, DRAIN_SIGNAL)

    @property
    def drained(self) -> bool:
        """Every worker exited after a drain."""
        return len(self._drained) == len(self.processes)

    def died(self, index: int) -> int | None:
        """Free dead worker `index`'s sessions and plan its restart (none while draining); the exit
        status to stop the server with when it has used up its RestartBudget, else None."""
        process = self.processes[index]
        process.join()
        lost = self._slots.clear(index)
        if self.draining:
            logger.info("worker %d (pid %s) drained and %s", index, process.pid, describe_exit(process.exitcode))
            self._drained.add(index)
            return None
        now = time.monotonic()
        delay = self._budget.delay(index, now - self._started_at[index])
        what = f"worker {index} (pid {process.pid}) {describe_exit(process.exitcode)}"
        if delay is None:
            logger.error(
                "%s, %d times in a row within %g s of its start: giving up on it; stopping the other workers",
                what,
                self._budget.give_up_after,
                self._budget.quick_failure_s,
            )
            return process.exitcode if process.exitcode and process.exitcode > 0 else 1
        logger.error("%s; its sessions (%d) are lost; restarting it%s", what, lost, f" in {delay:g} s" if delay else "")
        self._restart_at[index] = now + delay
        self._died_at[index] = now
        return None

    def ready(self, index: int) -> None:
        """Worker `index` listens: if it was restarted, say how long the server was without it. A drain
        that began before it listened reaches it now (it ignored the signal until then)."""
        if self.draining and (pid := self.processes[index].pid) is not None:
            os.kill(pid, DRAIN_SIGNAL)
        died_at = self._died_at.pop(index, None)
        if died_at is not None:
            logger.warning(
                "worker %d (pid %s) is back, %.2f s after it died",
                index,
                self.processes[index].pid,
                time.monotonic() - died_at,
            )
