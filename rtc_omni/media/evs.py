"""EVS: the pixel-similarity pre-filter that keeps near-duplicate frames out of the frame buffer.

Semantics are exactly vLLM-Omni's FrameSimilarityFilter: a 64x64 bilinear thumbnail (aspect ratio
not kept, resized before the RGB conversion), similarity = 1 - MSE / 255^2 in float32 against the
last *retained* frame, drop when similarity >= threshold, the first frame always kept. Camera
frames that arrive over RTP are already decoded YUV: their thumbnail is scaled from it by FFmpeg's
bilinear scaler (images.frame_thumbnail), which averages slightly differently from Pillow's, for
a tenth of the CPU of an RGB copy plus Pillow's resize.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from PIL import Image


def thumbnail(image: Image.Image, size: int = 64) -> np.ndarray:
    """The (size, size, 3) uint8 array EVS compares."""
    return np.asarray(image.resize((size, size), Image.Resampling.BILINEAR).convert("RGB"), dtype=np.uint8)


@dataclass
class FilterStats:
    retained_count: int = 0
    dropped_count: int = 0


class FrameSimilarityFilter:
    """Decides, frame by frame, whether a frame differs enough from the last kept one."""

    def __init__(self, threshold: float = 0.95, thumbnail_size: int = 64) -> None:
        if not 0.0 <= threshold <= 1.0:
            raise ValueError(f"threshold must be within [0, 1], got {threshold}")
        if thumbnail_size < 1:
            raise ValueError(f"thumbnail_size must be >= 1, got {thumbnail_size}")
        self.threshold = threshold
        self.thumbnail_size = thumbnail_size
        self.stats = FilterStats()
        self._reference: np.ndarray | None = None

    def similarity(self, thumb: np.ndarray) -> float:
        """Similarity of a thumbnail to the last retained one (1.0 = identical)."""
        assert self._reference is not None
        diff = thumb.astype(np.float32) - self._reference.astype(np.float32)
        return float(1.0 - np.mean(diff * diff) / np.float32(255.0 * 255.0))

    def should_retain(self, image: Image.Image) -> bool:
        """Keep (and remember) the image unless it is a near duplicate of the last kept one."""
        return self.should_retain_thumbnail(thumbnail(image, self.thumbnail_size))

    def should_retain_thumbnail(self, thumb: np.ndarray) -> bool:
        """`should_retain` for an image already reduced to its (thumbnail_size, thumbnail_size, 3) thumbnail."""
        if self._reference is not None and self.similarity(thumb) >= self.threshold:
            self.stats.dropped_count += 1
            return False
        self._reference = thumb
        self.stats.retained_count += 1
        return True
