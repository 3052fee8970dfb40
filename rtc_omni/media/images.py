"""Camera images from clients, bounded in pixels before they are decoded.

A compressed image says nothing about its decoded size: a 14 KB one-bit PNG of 9400x9400 decodes
to 265 MB of RGB. Pillow reads only the header on `Image.open`, so the size is checked there, and
an image over `--max-image-pixels` is refused (DataChannel and WebSocket frames) or scaled down to
fit (RTP frames, already decoded by aiortc, before their thumbnail and JPEG).

A sampled RTP frame is JPEG-encoded for the frame buffer straight from its YUV planes
(libjpeg-turbo through simplejpeg): no RGB copy, and no RGB -> YCbCr conversion inside the JPEG
encoder, 1.1 ms against 2.2 ms through Pillow for a 640x480 camera frame (docs/benchmarks.md).
"""

from __future__ import annotations

import io
import math

import av
import numpy as np
import simplejpeg
from PIL import Image

JPEG_YUV = "yuvj420p"  # full-range BT.601 4:2:0, what a baseline JPEG holds


class ImageTooLarge(ValueError):
    """The image has more pixels than the server takes."""


def open_image(data: bytes, max_pixels: int) -> Image.Image:
    """Decode an encoded image; ImageTooLarge before decoding when its header says it is too large."""
    image = Image.open(io.BytesIO(data))  # reads the header only
    width, height = image.size
    if width * height > max_pixels:
        raise ImageTooLarge(f"image of {width}x{height} is larger than this server takes ({max_pixels} pixels)")
    image.load()
    return image


def fitted_size(width: int, height: int, max_pixels: int) -> tuple[int, int]:
    """The largest even size of the same aspect ratio with at most `max_pixels` pixels."""
    if width * height <= max_pixels:
        return width, height
    scale = math.sqrt(max_pixels / (width * height))
    fitted_height = max(2, int(height * scale) // 2 * 2)
    fitted_width = max(2, min(int(width * scale), max_pixels // fitted_height) // 2 * 2)  # a sliver: the height is 2
    return fitted_width, fitted_height


def fit_frame(frame: av.VideoFrame, max_pixels: int) -> av.VideoFrame:
    """A decoded video frame as full-range YUV 4:2:0 (JPEG's), of even size, scaled down to at most
    `max_pixels` pixels."""
    width, height = fitted_size(frame.width, frame.height, max_pixels)
    return frame.reformat(width=max(2, width // 2 * 2), height=max(2, height // 2 * 2), format=JPEG_YUV)


def frame_thumbnail(frame: av.VideoFrame, size: int) -> np.ndarray:
    """The (size, size, 3) RGB thumbnail EVS compares, scaled bilinearly from the frame's YUV."""
    return frame.reformat(width=size, height=size, format="rgb24", interpolation="BILINEAR").to_ndarray()


def frame_to_jpeg(frame: av.VideoFrame, quality: int) -> bytes:
    """A `fit_frame` frame as JPEG, encoded from its planes as they are."""
    assert frame.format.name == JPEG_YUV, frame.format.name
    planes = [
        np.ascontiguousarray(
            np.frombuffer(memoryview(plane), np.uint8).reshape(plane.height, plane.line_size)[:, : plane.width]
        )
        for plane in frame.planes
    ]
    return simplejpeg.encode_jpeg_yuv_planes(*planes, quality=quality)
