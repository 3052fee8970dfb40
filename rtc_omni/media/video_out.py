"""The generated-video track: engine frames out as live RTP, paced in media time.

Frames wait in a bounded backlog (writers wait when it is full, which back-pressures the engine)
and leave at exactly `fps`: frame n is due at origin + n / fps on the wall clock. When the engine
is slower than real time the track sends nothing (the peer holds the last frame), and when frames
arrive again the clock is re-based to now rather than bursting to catch up. When the frames were
ready but the sender ran late (a busy event loop), it catches up instead, for at most
MAX_CATCH_UP_S, so a loaded machine still delivers the requested rate. `park()` holds every frame
while the session has no connection to show them on (a lost peer awaiting its resume), and `unpark()`
goes on from the first unsent one.
"""

from __future__ import annotations

import asyncio
import fractions
import time
from collections import deque
from collections.abc import Awaitable, Callable

import av
import numpy as np
from aiortc.mediastreams import MediaStreamError, MediaStreamTrack

from .. import metrics

VIDEO_CLOCK_RATE = 90_000
_TIME_BASE = fractions.Fraction(1, VIDEO_CLOCK_RATE)
MAX_CATCH_UP_S = 0.5  # a sender this late re-bases rather than bursting the missed frames

FrameObserver = Callable[[np.ndarray], Awaitable[None]]


class GeneratedVideoTrack(MediaStreamTrack):
    """An outgoing video track fed frame by frame by a generation session."""

    kind = "video"

    def __init__(self, max_backlog_frames: int = 48, put_timeout_s: float = 60.0) -> None:
        super().__init__()
        self.max_backlog_frames = max_backlog_frames
        self.put_timeout_s = put_timeout_s
        self.fps = 24.0
        self.on_frame_sent: FrameObserver | None = None  # e.g. the MP4 recorder
        self._backlog: deque[tuple[np.ndarray, bool, float]] = deque()  # (frame, is_filler, queued at)
        self._last: np.ndarray | None = None
        self._changed = asyncio.Event()  # backlog grew, shrank, or the track stopped
        self._origin: float | None = None
        self._due: float | None = None
        self._parked = False
        self.frames_sent = 0
        self.rebases = 0

    @property
    def backlog(self) -> int:
        return len(self._backlog)

    def _notify(self) -> None:
        self._changed.set()
        self._changed = asyncio.Event()

    async def _wait_change(self) -> None:
        await self._changed.wait()

    async def put(self, rgb: np.ndarray) -> None:
        """Queue one (H, W, 3) uint8 frame; waits (bounded) while the backlog is full."""
        async with asyncio.timeout(self.put_timeout_s):
            while len(self._backlog) >= self.max_backlog_frames:
                if self.readyState != "live":
                    raise MediaStreamError
                await self._wait_change()
        self._backlog.append((rgb, False, time.monotonic()))
        self._notify()

    def end_of_stream(self) -> None:
        """Follow the last frame with one repeat of it, sent but not counted or recorded.

        Receivers release a frame from their jitter buffer when the next one starts (aiortc does
        exactly this), so without a follower the last generated frame would never be shown.
        """
        if self._last is not None:
            self._backlog.append((self._last, True, time.monotonic()))
            self._notify()

    def flush(self) -> int:
        """Drop every frame not yet sent; returns how many."""
        dropped = len(self._backlog)
        self._backlog.clear()
        self._notify()
        return dropped

    def park(self) -> None:
        self._parked = True

    def unpark(self) -> None:
        if self._parked:
            self._parked = False
            self._notify()

    async def wait_drained(self, timeout: float) -> bool:
        """Wait until every queued frame has been handed to the sender; False on timeout."""
        try:
            async with asyncio.timeout(timeout):
                while self._backlog:
                    await self._wait_change()
            return True
        except TimeoutError:
            return False

    async def recv(self) -> av.VideoFrame:
        while not self._backlog or self._parked:
            if self.readyState != "live":
                raise MediaStreamError
            await self._wait_change()
        if self.readyState != "live":
            raise MediaStreamError
        interval = 1.0 / self.fps
        now = time.monotonic()
        if self._due is None:
            self._origin = self._due = now
        elif now > self._due + interval and (self._backlog[0][2] > self._due or now > self._due + MAX_CATCH_UP_S):
            # The engine fell behind (this frame came after its time): show it now and keep the
            # pace from here, no burst. A frame that waited for a late sender is sent at once instead.
            self._due = now
            self.rebases += 1
        elif now < self._due:
            await asyncio.sleep(self._due - now)
            if not self._backlog or self._parked or self.readyState != "live":  # flushed, parked, stopped
                return await self.recv()
        rgb, filler, _ = self._backlog.popleft()
        self._notify()
        assert self._origin is not None
        frame = av.VideoFrame.from_ndarray(rgb, format="rgb24")
        frame.pts = round((self._due - self._origin) * VIDEO_CLOCK_RATE)
        frame.time_base = _TIME_BASE
        self._due += interval
        if not filler:
            self._last = rgb
            self.frames_sent += 1
            metrics.GENERATED_FRAMES_SENT.inc()
            if self.on_frame_sent is not None:
                await self.on_frame_sent(rgb)
        return frame

    def stop(self) -> None:
        self._backlog.clear()
        super().stop()
        self._notify()
