"""Ingest: drain the peer's camera and microphone tracks into what a session consumes.

aiortc decodes every RTP frame into an unbounded queue; these loops empty it continuously. Video is
sampled by media time at the session's `sample_fps`, and only sampled frames are scaled to fit,
converted to JPEG's full-range YUV and handed on; audio is resampled to 16 kHz mono PCM16 with
av.AudioResampler.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Callable, Coroutine
from typing import Any, Protocol

import av
from aiortc.mediastreams import MediaStreamError, MediaStreamTrack

from ..pcm import INPUT_SAMPLE_RATE
from .images import fit_frame

logger = logging.getLogger(__name__)


class MediaSink(Protocol):
    """The session side of ingest."""

    @property
    def sample_fps(self) -> float | None:
        """Current sampling rate, or None while the session does not take media yet."""
        ...

    def note_frame_received(self) -> None: ...

    async def add_track_frame(self, frame: av.VideoFrame, pts_ms: float | None, received_ts_ms: float) -> None:
        """A sampled frame, already `fit_frame`d."""
        ...

    def add_track_audio(self, pcm16: bytes) -> None: ...


async def iter_frames(track: MediaStreamTrack) -> AsyncIterator[Any]:
    """Every frame of a track (av.VideoFrame or av.AudioFrame by its kind) until the track ends."""
    while True:
        try:
            yield await track.recv()
        except MediaStreamError:
            return


def _pts_seconds(frame: av.VideoFrame) -> float | None:
    if frame.pts is None or frame.time_base is None:
        return None
    return float(frame.pts * frame.time_base)


# A frame this close before its due time counts as due: due times are sums of float intervals, and a
# camera sending a multiple of the sampling rate (client/media.py camera_send_fps) has frames exactly
# on them, which float rounding would otherwise push one frame late.
DUE_TOLERANCE_S = 0.001


class FrameSampler:
    """Picks frames at a fixed rate of media time; robust to bursts and to rate changes."""

    def __init__(self) -> None:
        self._next_at: float | None = None

    def take(self, at: float, fps: float) -> bool:
        interval = 1.0 / fps
        if self._next_at is None or at >= self._next_at - DUE_TOLERANCE_S:
            # Schedule from the due time, not from `at`, so the rate stays exact; resync after a gap.
            base = at if self._next_at is None or at - self._next_at > interval else self._next_at
            self._next_at = base + interval
            return True
        if self._next_at - at > interval:  # clock went backwards (new stream): resync
            self._next_at = at + interval
            return True
        return False


async def ingest_video(track: MediaStreamTrack, sink: MediaSink, max_pixels: int) -> None:
    """Drain a video track until it ends, passing sampled frames (at most `max_pixels`) to the sink."""
    sampler = FrameSampler()
    async for frame in iter_frames(track):
        received_ts_ms = time.monotonic() * 1000.0
        sink.note_frame_received()
        fps = sink.sample_fps
        if fps is None:
            continue
        pts_s = _pts_seconds(frame)
        if not sampler.take(pts_s if pts_s is not None else received_ts_ms / 1000.0, fps):
            continue
        fitted = await asyncio.to_thread(fit_frame, frame, max_pixels)
        await sink.add_track_frame(fitted, None if pts_s is None else pts_s * 1000.0, received_ts_ms)


async def ingest_audio(track: MediaStreamTrack, sink: MediaSink) -> None:
    """Drain an audio track until it ends, passing 16 kHz mono PCM16 to the sink."""
    resampler = av.AudioResampler(format="s16", layout="mono", rate=INPUT_SAMPLE_RATE)
    async for frame in iter_frames(track):
        if sink.sample_fps is None:  # not configured yet: drop, keep draining
            continue
        pcm = b"".join(out.to_ndarray().tobytes() for out in resampler.resample(frame))
        if pcm:
            sink.add_track_audio(pcm)


async def discard(track: MediaStreamTrack) -> None:
    """Drain a track nobody consumes, so aiortc's unbounded queue stays empty."""
    async for _frame in iter_frames(track):
        pass


def start_ingest(
    track: MediaStreamTrack,
    sink: MediaSink,
    spawn: Callable[[Coroutine[Any, Any, None]], asyncio.Task[Any]],
    max_image_pixels: int,
) -> asyncio.Task[None] | None:
    """Start the drain loop that fits the track's kind."""
    if track.kind == "video":
        return spawn(ingest_video(track, sink, max_image_pixels))
    if track.kind == "audio":
        return spawn(ingest_audio(track, sink))
    logger.warning("ignoring track of kind %s", track.kind)
    return None
