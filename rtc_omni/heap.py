"""A closed session's memory, given back when it closes rather than whenever CPython's collector runs.

A closed session is a web of reference cycles (aiortc's peer connection and its transports, our
session objects around it), so reference counting frees none of it; CPython's full collection, paced
by object counts, came only every few dozen sessions in the soak, while each web held native memory
the collector cannot weigh (codec contexts and their threads, media buffers). So the server collects
shortly after sessions close, with its startup heap frozen so that a collection walks only what
sessions made (docs/operations.md, Metrics).
"""

from __future__ import annotations

import asyncio
import gc

# After the first of several closes, long enough for their teardown tasks to let go; also the most
# often a churn of sessions makes the server collect.
COLLECT_DELAY_S = 1.0
# A loaded server may still be tearing a session down at the first collection: it collects again
# while a collection finds garbage, this many times at most after a close.
MAX_PASSES = 5


def freeze_startup_heap() -> None:
    """Leave what the server built before serving out of every later collection (gc.freeze)."""
    gc.collect()
    gc.freeze()


class ClosedSessionCollector:
    """Runs a full collection COLLECT_DELAY_S after a session closes (one for every close meanwhile),
    and again while one finds garbage, up to MAX_PASSES."""

    def __init__(self) -> None:
        self._pending: asyncio.TimerHandle | None = None
        self._passes_left = 0

    def session_closed(self) -> None:
        self._passes_left = MAX_PASSES
        if self._pending is None:
            self._pending = asyncio.get_running_loop().call_later(COLLECT_DELAY_S, self._collect)

    def _collect(self) -> None:
        self._pending = None
        self._passes_left -= 1
        if gc.collect() and self._passes_left > 0:
            self._pending = asyncio.get_running_loop().call_later(COLLECT_DELAY_S, self._collect)
