"""One --max-sessions across workers: each worker's open sessions, counted in shared memory."""

from __future__ import annotations

import multiprocessing
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class SessionSlots:
    """Sessions open in each worker, in memory the parent maps before forking, so all workers see it.

    A worker counts only in its own slot, so the parent frees a dead worker's sessions by zeroing
    its slot (`clear`). Taking a slot checks the total under the array's lock: two workers cannot
    both take the last one.
    """

    workers: int
    worker: int = 0  # the slot this process counts in (`owned_by`)
    _counts: Any = field(default=None, repr=False)

    def __post_init__(self) -> None:
        if self._counts is None:
            object.__setattr__(self, "_counts", multiprocessing.get_context("fork").Array("i", self.workers))

    def owned_by(self, worker: int) -> SessionSlots:
        """The same shared counts, seen by `worker`."""
        return SessionSlots(self.workers, worker, self._counts)

    def total(self) -> int:
        with self._counts.get_lock():
            return sum(self._counts)

    def take(self, limit: int) -> bool:
        """Count one more session for this worker, unless `limit` are open across all workers."""
        with self._counts.get_lock():
            if sum(self._counts) >= limit:
                return False
            self._counts[self.worker] += 1
            return True

    def release(self) -> None:
        with self._counts.get_lock():
            self._counts[self.worker] = max(0, self._counts[self.worker] - 1)

    def clear(self, worker: int) -> None:
        """Free the sessions of a worker that died."""
        with self._counts.get_lock():
            self._counts[worker] = 0
