"""A real FFmpeg WHIP publisher (PyAV's bundled FFmpeg 8 `whip` muxer), run as a subprocess.

Publishes a solid-colour H.264 picture (Baseline, no B-frames) and an Opus 48 kHz stereo tone,
paced in real time, then closes the muxer, which sends DELETE to the session's Location. It stops
after SECONDS, or earlier once its stdin is closed (the test has seen enough).
Usage: python -m tests.ffmpeg_whip_publisher URL TOKEN CERT KEY SECONDS
"""

from __future__ import annotations

import select
import sys
import time
from collections.abc import Callable

import av
import numpy as np

FPS = 30
AUDIO_RATE = 48_000
AUDIO_FRAME = 960
WIDTH, HEIGHT = 320, 240


def stdin_closed() -> bool:
    """Whether stdin reads at once (EOF: the test closed it), without waiting."""
    return bool(select.select([sys.stdin], [], [], 0)[0])


def publish(
    url: str,
    token: str,
    cert: str,
    key: str,
    seconds: float,
    rgb=(255, 0, 0),
    hz: float = 440.0,
    stop: Callable[[], bool] = lambda: False,
) -> None:
    options = {
        "authorization": token,
        "cert_file": cert,
        "key_file": key,
        "whip_flags": "dtls_active",
        "handshake_timeout": "10000",
    }
    with av.open(url, mode="w", format="whip", options=options) as out:
        video = out.add_stream(
            "libx264",
            rate=FPS,
            options={"bf": "0", "profile": "baseline", "tune": "zerolatency", "preset": "veryfast", "g": str(FPS)},
        )
        video.width, video.height, video.pix_fmt, video.bit_rate = WIDTH, HEIGHT, "yuv420p", 1_000_000
        audio = out.add_stream("libopus", rate=AUDIO_RATE, layout="stereo")
        audio.bit_rate = 64_000
        picture = np.empty((HEIGHT, WIDTH, 3), dtype=np.uint8)
        picture[:] = rgb
        samples_sent = 0
        start = time.monotonic()
        for index in range(int(seconds * FPS)):
            if stop():
                break
            frame = av.VideoFrame.from_ndarray(picture, format="rgb24")
            frame.pts = index
            for packet in video.encode(frame):
                out.mux(packet)
            while samples_sent < (index + 1) * AUDIO_RATE // FPS:
                t = (samples_sent + np.arange(AUDIO_FRAME)) / AUDIO_RATE
                tone = (0.3 * 32767 * np.sin(2 * np.pi * hz * t)).astype(np.int16)
                chunk = av.AudioFrame.from_ndarray(np.repeat(tone, 2).reshape(1, -1), format="s16", layout="stereo")
                chunk.sample_rate, chunk.pts = AUDIO_RATE, samples_sent
                for packet in audio.encode(chunk):
                    out.mux(packet)
                samples_sent += AUDIO_FRAME
            delay = start + (index + 1) / FPS - time.monotonic()
            if delay > 0:
                time.sleep(delay)


if __name__ == "__main__":
    url, token, cert, key, seconds = sys.argv[1:6]
    publish(url, token, cert, key, float(seconds), stop=stdin_closed)
