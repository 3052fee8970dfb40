"""A session's media outputs, as ports: where its speech and its generated video go.

Sessions write to these and never touch a transport: the RTP tracks in media/ (talker.py,
video_out.py) and the WebSocket's fMP4 sink (media/fmp4_sink.py) implement them.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Protocol

import numpy as np

from ..media.echo import EchoReference


class Talker(Protocol):
    """Where a session's speech goes (the outgoing RTP audio track, media/talker.py)."""

    echo: EchoReference  # what it played recently, so its echo can be told from a person

    async def write(self, pcm16: bytes) -> None: ...

    def flush(self) -> float: ...

    def hold(self) -> None:
        """Stop the speech at once, keeping what was not sent."""

    def release(self) -> None:
        """Go on with what `hold()` kept."""

    async def wait_drained(self, timeout: float) -> bool: ...


class VideoSink(Protocol):
    """Where generated frames go (the outgoing RTP video track)."""

    fps: float
    frames_sent: int
    on_frame_sent: Callable[[np.ndarray], Awaitable[None]] | None

    async def put(self, rgb: np.ndarray) -> None: ...

    def flush(self) -> int: ...

    def end_of_stream(self) -> None: ...

    async def wait_drained(self, timeout: float) -> bool: ...
