"""On SIGUSR1, where the server's Python memory is: the top allocation sites by size, and those that grew
since the last signal, in the log. It needs tracemalloc tracing (PYTHONTRACEMALLOC=1 at start), so a
leak hunt costs nothing when it is off (docs/operations.md, Metrics)."""

from __future__ import annotations

import asyncio
import functools
import gc
import logging
import sys
import threading
import time
import tracemalloc

logger = logging.getLogger(__name__)

TOP_SITES = 20
Site = tuple[str, int]  # file, line


@functools.cache  # one entry per source file
def short_path(filename: str) -> str:
    """`filename` relative to the sys.path entry it was imported from (`aiortc/rtcsctptransport.py`)."""
    roots = [root for root in sys.path if root and filename.startswith(root.rstrip("/") + "/")]
    return filename[len(max(roots, key=len).rstrip("/")) + 1 :] if roots else filename


class AllocationReport:
    """Logs the top sites each time it is asked, and what grew since it was last asked."""

    def __init__(self, top: int = TOP_SITES) -> None:
        self.top = top
        self._last: dict[Site, tuple[int, int]] = {}  # site -> (bytes, blocks), small: one entry per line
        self._last_at: float | None = None
        self._busy = threading.Lock()

    def log_soon(self) -> None:
        """Log from a thread: grouping a large heap's traces takes seconds, which the event loop (and
        every session's media) would otherwise wait out."""
        if not tracemalloc.is_tracing():
            logger.warning("SIGUSR1: tracemalloc is not tracing; start the server with PYTHONTRACEMALLOC=1")
        elif self._busy.acquire(blocking=False):  # a second signal while one report runs is dropped
            asyncio.get_running_loop().run_in_executor(None, self.log).add_done_callback(lambda _: self._busy.release())

    def log(self) -> None:
        unreachable = gc.collect()  # what is still referenced, not what waits for the collector
        sites: dict[Site, tuple[int, int]] = {}
        for stat in tracemalloc.take_snapshot().statistics("lineno"):
            frame = stat.traceback[0]
            if frame.filename not in (__file__, tracemalloc.__file__):  # the report's own figures are no leak
                sites[(short_path(frame.filename), frame.lineno)] = (stat.size, stat.count)
        total = sum(size for size, _ in sites.values())
        lines = [
            f"allocation sites: {total / 2**20:.1f} MiB traced, after collecting {unreachable} unreachable objects; "
            f"top {self.top} by size:"
        ]
        lines += [_row(rank, site, *sites[site], "") for rank, site in enumerate(_largest(sites, self.top), 1)]
        if self._last_at is not None:
            growth = {site: _minus(now, self._last.get(site, (0, 0))) for site, now in sites.items()}
            grown = [site for site in _largest(growth, self.top) if growth[site][0] > 0]
            lines.append(f"grown since the last SIGUSR1 ({time.monotonic() - self._last_at:.0f} s ago):")
            lines += [_row(rank, site, *growth[site], "+") for rank, site in enumerate(grown, 1)]
        self._last, self._last_at = sites, time.monotonic()
        logger.info("\n".join(lines))


def _largest(sites: dict[Site, tuple[int, int]], top: int) -> list[Site]:
    return sorted(sites, key=lambda site: sites[site][0], reverse=True)[:top]


def _minus(now: tuple[int, int], before: tuple[int, int]) -> tuple[int, int]:
    return now[0] - before[0], now[1] - before[1]


def _row(rank: int, site: Site, size: int, blocks: int, sign: str) -> str:
    """`sign` "+" writes the figures as changes."""
    return f"{rank:3d}. {size / 1024:{sign}10.1f} KiB {blocks:{sign}8d} blocks  {site[0]}:{site[1]}"
