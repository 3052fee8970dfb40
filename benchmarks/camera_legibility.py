"""Can text in the camera still be read at a lower video bitrate? OCR as a stand-in for the model.

Halving the camera's bitrate would save the server about 8 % of a session's CPU (VP8 decoding and
packets scale with it; docs/benchmarks.md), but only if what the model sees survives. This
renders a 640x480 scene at the page's 5 fps for 8 s: a card with two lines of words at each of
three text sizes, on a busy 1/f-textured room that the encoder must also spend bits on, with a
person-sized block moving across the bottom, a hand-held camera's sub-pixel sway, a flicker of
light and sensor noise. It encodes the scene as VP8 (libvpx, real-time, constant rate, as a
browser does) at each target bitrate, decodes it, keeps every frame as the server buffers it
(fit_frame + JPEG at the track's quality) and, about twice a second after the first 2 s, reads
each text size's lines with tesseract. It prints the bitrate reached, how much of each size's
text was read (difflib's ratio against the truth: 1.0 is every character) and the frames' PSNR
against the source. The source row is the ceiling: the frames kept as the server keeps them
(JPEG), never VP8-encoded.
Figures: docs/benchmarks.md, "What a session's CPU is made of, part by part".
Usage: python -m benchmarks.camera_legibility [KBPS ...]   (default 500 300 200 150 100;
needs tesseract-ocr and the DejaVu fonts: apt-get install tesseract-ocr fonts-dejavu-core)
"""

from __future__ import annotations

import difflib
import io
import random
import subprocess
import sys
import tempfile

import av
import numpy as np
from PIL import Image, ImageDraw, ImageFont

from rtc_omni.bench.replay import realtime_vp8_encoder
from rtc_omni.media.images import fit_frame, frame_to_jpeg
from rtc_omni.sessions.understand import TRACK_JPEG_QUALITY

WIDTH, HEIGHT, FPS, SECONDS = 640, 480, 5, 8
MARGIN = 20  # the scene is drawn this much larger on every side, for the camera's sway
TEXT_PX = (9, 11, 14)
FONT = "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf"
WORDS = "apple river stone cloud paper seven window orange silver market garden yellow thirty bridge".split()
SKIP_FRAMES = 2 * FPS  # rate control settles over the first seconds
READ_EVERY = 3  # frames: about twice a second at 5 fps, as the session samples


def card_lines() -> dict[int, list[str]]:
    words = random.Random(1)
    return {px: [" ".join(words.choice(WORDS) for _ in range(4)) for _ in range(2)] for px in TEXT_PX}


def room(lines: dict[int, list[str]]) -> tuple[Image.Image, dict[int, tuple[int, int, int, int]]]:
    """The scene, MARGIN larger on every side, and each text size's box in it."""
    height, width = HEIGHT + 2 * MARGIN, WIDTH + 2 * MARGIN
    spectrum = np.fft.rfft2(np.random.default_rng(3).normal(size=(height, width)))
    fy, fx = np.meshgrid(np.fft.fftfreq(height), np.fft.rfftfreq(width), indexing="ij")
    texture = np.fft.irfft2(spectrum / np.maximum(np.hypot(fy, fx), 1 / 400), s=(height, width))
    texture = (texture - texture.mean()) / texture.std() * 40
    across, down = np.meshgrid(np.linspace(90, 170, width), np.linspace(110, 170, height))
    gradient = np.stack([across, down, np.full((height, width), 80.0)], axis=2)
    image = Image.fromarray(np.clip(gradient + texture[:, :, None], 0, 255).astype(np.uint8))
    draw = ImageDraw.Draw(image)
    draw.rectangle([60, 60, 600, 420], fill=(235, 232, 225))
    boxes, y = {}, 80
    for px, texts in lines.items():
        font, top = ImageFont.truetype(FONT, px), y
        for text in texts:
            draw.text((80, y), text, fill=(20, 20, 25), font=font)
            y += int(px * 1.6)
        boxes[px] = (70, top - 6, 590, y)
        y += 20
    return image, boxes


def camera(scene: Image.Image) -> tuple[list[np.ndarray], list[tuple[int, int]]]:
    """The frames, and each one's whole-pixel offset into the scene."""
    noise = np.random.default_rng(0)
    frames, offsets = [], []
    for index in range(FPS * SECONDS):
        fx, fy = MARGIN + 6 * np.sin(index / 3.0), MARGIN + 4 * np.cos(index / 4.0)
        moved = scene.transform(
            (WIDTH, HEIGHT), Image.Transform.AFFINE, (1, 0, fx, 0, 1, fy), resample=Image.Resampling.BILINEAR
        )
        pixels = np.asarray(moved).astype(np.float32) * (1 + 0.02 * np.sin(index)) + noise.normal(
            0, 2.0, (HEIGHT, WIDTH, 3)
        )
        x = (index * 37) % (WIDTH - 160)
        pixels[400:480, x : x + 160] = 255 - pixels[400:480, x : x + 160]
        frames.append(np.clip(pixels, 0, 255).astype(np.uint8))
        offsets.append((round(fx), round(fy)))
    return frames, offsets


def as_buffered(frame: av.VideoFrame) -> np.ndarray:
    """A decoded frame as the session keeps it: fitted, JPEG at the track's quality."""
    jpeg = frame_to_jpeg(fit_frame(frame, WIDTH * HEIGHT), TRACK_JPEG_QUALITY)
    return np.asarray(Image.open(io.BytesIO(jpeg)).convert("RGB"))


def through_vp8(frames: list[np.ndarray], bitrate: int) -> tuple[list[np.ndarray], float]:
    """The frames encoded at `bitrate` and decoded as the server buffers them; kb/s reached."""
    encoder = realtime_vp8_encoder(WIDTH, HEIGHT, FPS, bitrate)
    decoder = av.CodecContext.create("libvpx", "r")
    decoded, size = [], 0
    for index, pixels in enumerate(frames):
        frame = av.VideoFrame.from_ndarray(pixels, format="rgb24").reformat(format="yuv420p")
        frame.pts = index
        for packet in encoder.encode(frame):
            size += packet.size
            decoded += [as_buffered(out) for out in decoder.decode(av.Packet(bytes(packet)))]
    if len(decoded) != len(frames):
        raise RuntimeError(f"libvpx gave {len(decoded)} frames for {len(frames)}")
    return decoded, size * 8 / SECONDS / 1000


def read_text(pixels: np.ndarray) -> str:
    with tempfile.NamedTemporaryFile(suffix=".png") as image:
        Image.fromarray(pixels).save(image.name)
        run = subprocess.run(
            ["tesseract", image.name, "stdout", "--psm", "6"], capture_output=True, text=True, timeout=30
        )
    return " ".join(run.stdout.split())


def psnr(a: np.ndarray, b: np.ndarray) -> float:
    mse = float(np.mean((a.astype(np.float32) - b.astype(np.float32)) ** 2))
    return 10 * np.log10(255**2 / max(mse, 1e-10))


def report(
    label: str,
    frames: list[np.ndarray],
    source: list[np.ndarray],
    offsets: list[tuple[int, int]],
    boxes: dict[int, tuple[int, int, int, int]],
    lines: dict[int, list[str]],
) -> None:
    read: dict[int, list[float]] = {px: [] for px in TEXT_PX}
    indices = range(SKIP_FRAMES, len(frames), READ_EVERY)
    for index in indices:
        dx, dy = offsets[index]
        for px, (x0, y0, x1, y1) in boxes.items():
            got = read_text(frames[index][y0 - dy : y1 - dy, x0 - dx : x1 - dx])
            read[px].append(difflib.SequenceMatcher(None, " ".join(lines[px]), got).ratio())
    quality = np.mean([psnr(frames[i], source[i]) for i in indices])
    text = "  ".join(f"{px} px {np.mean(v):.3f} (min {min(v):.2f})" for px, v in read.items())
    print(f"{label:34} text read: {text}  PSNR {quality:.1f} dB", flush=True)


def main(rates_kbps: list[int]) -> None:
    lines = card_lines()
    scene, boxes = room(lines)
    source, offsets = camera(scene)
    buffered = [as_buffered(av.VideoFrame.from_ndarray(pixels, format="rgb24")) for pixels in source]
    report("source, only JPEG as buffered", buffered, source, offsets, boxes, lines)
    for kbps in rates_kbps:
        decoded, reached = through_vp8(source, kbps * 1000)
        report(f"VP8 target {kbps} kb/s: {reached:.0f} kb/s", decoded, source, offsets, boxes, lines)


if __name__ == "__main__":
    main([int(arg) for arg in sys.argv[1:]] or [500, 300, 200, 150, 100])
