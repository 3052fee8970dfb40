"""Waiting in the test's own event loop, where the in-process server runs: a condition polled until it
holds, and the server-side tasks still alive (a freed session leaves none)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable


def server_tasks() -> list[asyncio.Task]:
    """Live asyncio tasks running server-side rtc_omni code (sessions, ingest, signaling)."""
    found = []
    for task in asyncio.all_tasks():
        code = getattr(task.get_coro(), "cr_code", None)
        path = code.co_filename if code is not None else ""
        if "/rtc_omni/" in path and "/rtc_omni/client/" not in path:
            found.append(task)
    return found


async def wait_until(predicate: Callable[[], object], timeout: float = 10.0) -> None:
    async with asyncio.timeout(timeout):
        while not predicate():
            await asyncio.sleep(0.05)
