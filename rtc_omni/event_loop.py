"""The event loop each server process runs.

uvloop (libuv) does the loop's own work in C: waking on sockets, timers, datagram reads and
writes. A session's media is mostly small datagrams and timers, so the loop's share of its CPU is
large; on uvloop one understanding session costs about 4 % less (docs/benchmarks.md). aiortc,
aioice and aiohttp run on it unchanged. `--event-loop asyncio` keeps the standard library's.
"""

from __future__ import annotations

import asyncio
import importlib.util
from collections.abc import Callable
from typing import Literal

EventLoopChoice = Literal["auto", "uvloop", "asyncio"]


class EventLoopUnavailable(RuntimeError):
    """The chosen event loop is not installed."""


def loop_factory(choice: EventLoopChoice) -> Callable[[], asyncio.AbstractEventLoop] | None:
    """What `asyncio.Runner(loop_factory=...)` should make for `choice`; None is asyncio's own loop."""
    if choice == "asyncio":
        return None
    if importlib.util.find_spec("uvloop") is None:
        if choice == "uvloop":
            raise EventLoopUnavailable("--event-loop uvloop: uvloop is not installed (pip install uvloop)")
        return None
    import uvloop

    return uvloop.new_event_loop
