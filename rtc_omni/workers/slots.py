"""One --max-sessions across workers: each worker's open sessions, counted in shared memory."""

from __future__ import annotations

import fcntl
import multiprocessing
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import IO, Any


@dataclass(frozen=True)
class SessionSlots:
    """Sessions open in each worker, in memory the parent maps before forking, so all workers see it.

    A worker counts only in its own slot, so the parent frees a dead worker's sessions by zeroing
    its slot (`clear`). Taking a slot checks the total under a lock: two workers cannot both take
    the last one. The lock is a POSIX record lock, which the kernel drops when its holder dies: a
    worker killed while holding it cannot leave its siblings and the parent waiting forever.
    """

    workers: int
    worker: int = 0  # the slot this process counts in (`owned_by`)
    _counts: Any = field(default=None, repr=False)
    _lock_file: IO[bytes] | None = field(default=None, repr=False)  # an unlinked file, inherited by the fork

    def __post_init__(self) -> None:
        if self._counts is None:
            counts = multiprocessing.get_context("fork").Array("i", self.workers, lock=False)
            object.__setattr__(self, "_counts", counts)
            object.__setattr__(self, "_lock_file", tempfile.TemporaryFile())

    def owned_by(self, worker: int) -> SessionSlots:
        """The same shared counts, seen by `worker`."""
        return SessionSlots(self.workers, worker, self._counts, self._lock_file)

    @contextmanager
    def _locked(self) -> Iterator[None]:
        assert self._lock_file is not None
        fcntl.lockf(self._lock_file, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.lockf(self._lock_file, fcntl.LOCK_UN)

    def total(self) -> int:
        with self._locked():
            return sum(self._counts)

    def take(self, limit: int) -> bool:
        """Count one more session for this worker, unless `limit` are open across all workers."""
        with self._locked():
            if sum(self._counts) >= limit:
                return False
            self._counts[self.worker] += 1
            return True

    def release(self) -> None:
        with self._locked():
            self._counts[self.worker] = max(0, self._counts[self.worker] - 1)

    def clear(self, worker: int) -> int:
        """Free the sessions of a worker that died; how many it had."""
        with self._locked():
            lost: int = self._counts[worker]
            self._counts[worker] = 0
            return lost
