"""Camera images from clients, bounded in pixels before they are decoded.

A compressed image says nothing about its decoded size: a 14 KB one-bit PNG of 9400x9400 decodes
to 265 MB of RGB. Pillow reads only the header on `Image.open`, so the size is checked there, and
an image over `--max-image-pixels` is refused (DataChannel and WebSocket frames) or scaled down to
fit (RTP frames, already decoded by aiortc, before their RGB copy and JPEG).
"""

from __future__ import annotations

import io
import math

import av
from PIL import Image


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


def frame_to_image(frame: av.VideoFrame, max_pixels: int) -> Image.Image:
    """A decoded video frame as an RGB image, scaled down to at most `max_pixels` pixels."""
    width, height = fitted_size(frame.width, frame.height, max_pixels)
    if (width, height) == (frame.width, frame.height):
        return frame.to_image()
    return frame.to_image(width=width, height=height)
