"""A session's inbox: the client's typed messages and the session's own work items, one at a time.

Both paths feed one first-in first-out line, so a session handles everything in the order it
happened, but each has its own bound: a client flooding its messages cannot crowd out the work
the server gives itself (a turn the VAD detected, a barge-in).
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
    def __init__(self, max_messages: int, max_work: int) -> None:
        self.max_messages = max_messages
        self.max_work = max_work
        self._items: deque[M | WorkItem] = deque()
        self._messages = 0
        self._work = 0
        self._arrived = asyncio.Event()

    def put_message(self, message: M) -> bool:
        """Queue a client message; False (and dropped) when `max_messages` are waiting."""
        if self._messages >= self.max_messages:
            return False
        self._messages += 1
        self._append(message)
        return True

    def put_work(self, work: WorkItem) -> bool:
        """Queue a work item; False (and dropped) when `max_work` are waiting."""
        if self._work >= self.max_work:
            return False
        self._work += 1
        self._append(work)
        return True

    def _append(self, item: M | WorkItem) -> None:
        self._items.append(item)
        self._arrived.set()

    async def get(self, timeout: float | None = None) -> M | WorkItem | None:
        """The oldest item, waiting at most `timeout` seconds for one (None: no limit); None when that passed."""
        try:
            async with asyncio.timeout(timeout):
                while not self._items:
                    self._arrived.clear()
                    await self._arrived.wait()
        except TimeoutError:
            return None
        item = self._items.popleft()
        if isinstance(item, WorkItem):
            self._work -= 1
        else:
            self._messages -= 1
        return item

    def clear(self) -> None:
        self._items.clear()
        self._messages = self._work = 0
