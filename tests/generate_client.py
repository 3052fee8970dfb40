"""A generation session's peer as the tests open it, and the frames a receiver has once the last arrived."""

from __future__ import annotations

import contextlib
from typing import Any

from rtc_omni.client.media import VideoReceiver
from rtc_omni.client.rtc_peers import GenerateClient

from .conftest import RunningServer
from .waiting import wait_until

SMALL = {"size": "320x240"}


async def connect(server: RunningServer, **kwargs: Any) -> GenerateClient:
    client = GenerateClient(server.url, **kwargs)
    await client.connect()
    return client


async def received_through(receiver: VideoReceiver | None, last_index: int, timeout: float = 10.0) -> list:
    """What `receiver` has once frame `last_index` arrived (or, after `timeout`, whatever did).

    The server sends every frame, but on a loaded machine the last may reach the peer a little
    after `session.done`; a test that asserts completeness waits for it rather than a fixed time.
    """
    with contextlib.suppress(TimeoutError):
        await wait_until(lambda: receiver is not None and any(f.index >= last_index for f in receiver.frames), timeout)
    return list(receiver.frames) if receiver is not None else []
