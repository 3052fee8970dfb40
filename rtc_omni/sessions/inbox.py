"""A session's inbox: the client's typed messages and the session's own work items, one at a time.

Both paths feed one first-in first-out line, so a session handles everything in the order it
happened, but each has its own bound: a client flooding its messages cannot crowd out the work
the server gives itself (a turn the VAD detected, a barge-in). Client messages are bounded in bytes
as well as in count: 200 waiting WebSocket messages of 16 MiB would otherwise be 3 GiB.
"""

from __future__ import annotations

import asyncio
from collections import deque
from typing import Generic, TypeVar

M = TypeVar("M")


class WorkItem:
    """Base of the work a session queues for itself; never parsed from a client."""

    name = "work"  # for the log line and error of a failed item


class Inbox(Generic[M]):
    def __init__(self, max_messages: int, max_work: int, max_message_bytes: int) -> None:
        self._items: deque[tuple[M | WorkItem, int]] = deque()
        self._bounds = {"messages": max_messages, "work": max_work}
        self._waiting = {"messages": 0, "work": 0}
        self._max_message_bytes = max_message_bytes
        self._message_bytes = 0
        self._arrived = asyncio.Event()

    def put_message(self, message: M, size: int) -> bool:
        """Queue a client message of `size` bytes (as received); False (and dropped) when
        `max_messages` are waiting, or the waiting ones would hold more than `max_message_bytes`."""
        if self._message_bytes + size > self._max_message_bytes:
            return False
        return self._put(message, "messages", size)

    def put_work(self, work: WorkItem) -> bool:
        """Queue a work item; False (and dropped) when `max_work` are waiting."""
        return self._put(work, "work", 0)

    def _put(self, item: M | WorkItem, path: str, size: int) -> bool:
        if self._waiting[path] >= self._bounds[path]:
            return False
        self._waiting[path] += 1
        self._message_bytes += size
        self._items.append((item, size))
        self._arrived.set()
        return True

    async def get(self, timeout: float | None = None) -> M | WorkItem | None:
        """The oldest item, waiting at most `timeout` seconds for one (None: no limit); None when that passed."""
        try:
            async with asyncio.timeout(timeout):
                while not self._items:
                    self._arrived.clear()
                    await self._arrived.wait()
        except TimeoutError:
            return None
        item, size = self._items.popleft()
        self._waiting["work" if isinstance(item, WorkItem) else "messages"] -= 1
        self._message_bytes -= size
        return item

    def clear(self) -> None:
        self._items.clear()
        self._waiting = {"messages": 0, "work": 0}
        self._message_bytes = 0
