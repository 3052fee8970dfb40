"""The frame buffer a turn samples from: a bounded FIFO of encoded frames with their metadata."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class BufferedFrame:
    """One retained frame, still encoded (JPEG or PNG), and what the reference reports about it."""

    data: bytes
    frame_id: Any
    pts_ms: Any
    source_pts_ms: Any = None
    quality_profile: Any = None
    capture_ts_ms: Any = None
    receiver_received_ts_ms: float | None = None
    decoded_ready_ts_ms: float | None = None

    @property
    def has_id(self) -> bool:
        return isinstance(self.frame_id, str) and bool(self.frame_id)


def sample_indices(count: int, num_frames: int) -> list[int]:
    """vLLM-Omni's turn sampling: all frames if few, else strided from the oldest plus the newest."""
    if count <= num_frames:
        return list(range(count))
    stride = count // num_frames
    return [i * stride for i in range(num_frames - 1)] + [count - 1]


class FrameBuffer:
    """Holds at most `max_frames` frames; appending to a full buffer evicts the oldest."""

    def __init__(self, max_frames: int) -> None:
        self._frames: deque[BufferedFrame] = deque()
        self.max_frames = max_frames

    def __len__(self) -> int:
        return len(self._frames)

    def append(self, frame: BufferedFrame) -> BufferedFrame | None:
        """Add a frame; return the evicted one, if any."""
        evicted = self._frames.popleft() if len(self._frames) >= self.max_frames else None
        self._frames.append(frame)
        return evicted

    def sample(self, num_frames: int) -> list[BufferedFrame]:
        frames = list(self._frames)
        return [frames[i] for i in sample_indices(len(frames), num_frames)]

    @property
    def newest(self) -> BufferedFrame | None:
        return self._frames[-1] if self._frames else None
