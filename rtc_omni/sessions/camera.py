"""One camera path for every conversational session: sampled frames of a WebRTC camera through the
EVS similarity filter into the frame buffer, each JPEG-encoded once from its YUV planes.

A turn samples the buffer as vLLM-Omni does. A frame EVS filtered is encoded only if a turn takes
it (see `turn_frames`): on a still scene EVS filters nearly every sampled frame, and a turn takes at
most the newest. Every engine then gets the same JPEG; none encodes a camera frame again.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass, replace

import av

from .. import metrics
from ..engines.engine import TurnFrame
from ..media.evs import FrameSimilarityFilter
from ..media.images import frame_thumbnail, frame_to_jpeg
from .frame_buffer import BufferedFrame, FrameBuffer

logger = logging.getLogger(__name__)

JPEG_QUALITY = 90
# EVS threshold for camera-track frames when the client chose none. 0.95 keeps a frame only when its
# RMS difference exceeds ~57 of 255, which freezes a quiet webcam scene; 0.99 (RMS > ~25) still
# drops a static camera but follows a person moving.
TRACK_FILTER_THRESHOLD = 0.99


def now_ms() -> float:
    return time.monotonic() * 1000.0


@dataclass
class CameraCounters:
    received: int = 0
    sampled: int = 0
    filtered: int = 0
    evicted: int = 0


@dataclass
class _PendingFrame:
    """The newest sampled camera frame, kept even when EVS filtered it. Until a turn takes it, a
    filtered frame holds its fitted image (within --max-image-pixels; one per session, two for the
    moment a cancelled turn's encode takes to finish) instead of its JPEG."""

    frame: BufferedFrame
    buffered: bool
    image: av.VideoFrame | None = None

    async def encoded(self) -> BufferedFrame:
        """The frame with its JPEG, encoded at the first call (off the loop)."""
        if self.image is not None:
            jpeg = await asyncio.to_thread(frame_to_jpeg, self.image, JPEG_QUALITY)
            self.frame, self.image = replace(self.frame, data=jpeg), None
        return self.frame


class Camera:
    """A session's frame buffer and the EVS filter of its camera track."""

    def __init__(self, max_frames: int) -> None:
        self.frames = FrameBuffer(max_frames)
        self.counters = CameraCounters()
        self.track_filter: FrameSimilarityFilter | None = None
        self._latest: _PendingFrame | None = None
        self._seq = 0

    def filter_track(self, enabled: bool, threshold: float | None = None) -> None:
        """EVS on the camera track, at `threshold` or the camera path's default, or off."""
        if threshold is None:
            threshold = TRACK_FILTER_THRESHOLD
        self.track_filter = FrameSimilarityFilter(threshold) if enabled else None

    def note_received(self) -> None:
        self.counters.received += 1
        metrics.FRAMES.labels("received").inc()

    def note_sampled(self) -> None:
        self.counters.sampled += 1
        metrics.FRAMES.labels("sampled").inc()

    async def judge_track_frame(
        self, frame: av.VideoFrame, pts_ms: float | None, received_ts_ms: float
    ) -> tuple[BufferedFrame, bool]:
        """A sampled track frame judged by EVS, JPEG-encoded if retained; `buffer` it next (unless
        the session stopped meanwhile)."""
        self.note_sampled()
        self._seq += 1
        track_filter = self.track_filter

        def evaluate() -> tuple[bool, bytes]:
            keep = track_filter is None or track_filter.should_retain_thumbnail(
                frame_thumbnail(frame, track_filter.thumbnail_size)
            )
            return keep, frame_to_jpeg(frame, JPEG_QUALITY) if keep else b""

        retained, jpeg = await asyncio.to_thread(evaluate)
        buffered = BufferedFrame(
            data=jpeg,
            frame_id=f"rtp-{self._seq}",
            pts_ms=None if pts_ms is None else round(pts_ms, 3),
            receiver_received_ts_ms=received_ts_ms,
            decoded_ready_ts_ms=now_ms(),
        )
        self._latest = _PendingFrame(buffered, buffered=retained, image=None if retained else frame)
        return buffered, retained

    def buffer(self, frame: BufferedFrame, retained: bool) -> BufferedFrame | None:
        """Count a filtered frame, or buffer a retained one: the frame it evicted, if any."""
        if not retained:
            self.counters.filtered += 1
            metrics.FRAMES.labels("filtered").inc()
            return None
        evicted = self.frames.append(frame)
        if evicted is not None:
            self.counters.evicted += 1
        return evicted

    async def turn_frames(self, num_frames: int) -> list[BufferedFrame]:
        """vLLM-Omni's sample of the buffer, with the newest camera frame always current.

        EVS keeps near-duplicates out of the buffer, so on a still scene the newest buffered frame
        can be minutes old. When the newest sampled camera frame was filtered, it stands in for the
        newest buffered frame in this turn (EVS judged them alike), so the model's newest view is
        never older than one sampling interval; if it cannot be encoded, the buffered one stays.
        """
        frames = self.frames.sample(num_frames)
        latest = self._latest
        if latest is None or latest.buffered or not frames or frames[-1].frame_id == latest.frame.frame_id:
            return frames
        try:
            frames[-1] = await latest.encoded()
        except ValueError as exc:
            logger.warning("the newest camera frame failed to encode: %s", exc)
        return frames

    def clear(self) -> None:
        self.frames = FrameBuffer(1)
        self._latest = None


def engine_frames(frames: list[BufferedFrame]) -> list[TurnFrame]:
    """Buffered JPEGs as an engine's frames, decoded only as far as the engine looks."""
    return [
        TurnFrame(
            frame_id=f.frame_id if f.has_id else None,
            pts_ms=f.pts_ms if isinstance(f.pts_ms, (int, float)) else None,
            jpeg=f.data,
        )
        for f in frames
    ]
