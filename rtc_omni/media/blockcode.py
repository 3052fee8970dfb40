"""A frame index drawn as big black and white cells, readable after lossy video compression.

The synthetic generation engine stamps each frame with its index; tests and benchmarks read it
back at the peer to prove order, completeness and timing of the video path.
"""

from __future__ import annotations

import numpy as np

BITS = 16
_BAND_FRACTION = 0.08  # the code band's share of the frame height


def _cells(width: int, height: int) -> list[tuple[int, int, int, int]]:
    band = max(8, int(height * _BAND_FRACTION))
    cell = width // (BITS + 2)  # one guard cell either side
    return [((i + 1) * cell, (i + 2) * cell, 0, band) for i in range(BITS)]


def stamp(frame: np.ndarray, index: int) -> None:
    """Draw `index` (mod 2^16) into the top band of an (H, W, 3) uint8 frame, in place."""
    height, width = frame.shape[:2]
    band = max(8, int(height * _BAND_FRACTION))
    frame[:band] = 0
    for bit, (x0, x1, y0, y1) in enumerate(_cells(width, height)):
        if (index >> (BITS - 1 - bit)) & 1:
            frame[y0:y1, x0:x1] = 255


def read(frame: np.ndarray) -> int:
    """Read the index back from an (H, W, 3) or (H, W) frame, sampling each cell's centre."""
    height, width = frame.shape[:2]
    luma = frame.mean(axis=2) if frame.ndim == 3 else frame
    value = 0
    for x0, x1, y0, y1 in _cells(width, height):
        mx, my = (x1 - x0) // 4, (y1 - y0) // 4
        bit = float(luma[y0 + my : y1 - my, x0 + mx : x1 - mx].mean()) > 128
        value = (value << 1) | int(bit)
    return value
