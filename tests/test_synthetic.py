"""engines/synthetic.py: what the embedded engine measures in frames and audio, and its voices."""

from __future__ import annotations

import io

import numpy as np
import pytest
from PIL import Image

from rtc_omni.engines.engine import TurnFrame
from rtc_omni.engines.synthetic import colour_name, dominant_frequency, espeak_voice, motion_score, tone_voice


@pytest.mark.parametrize(
    ("rgb", "name"),
    [
        ((250, 3, 2), "red"),
        ((1, 2, 250), "blue"),
        ((0, 250, 5), "green"),
        ((250, 250, 0), "yellow"),
        ((10, 10, 10), "black"),
    ],
)
def test_colour_names(rgb: tuple[int, int, int], name: str) -> None:
    assert colour_name(rgb) == name


def test_dominant_frequency_and_silence() -> None:
    t = np.arange(32000) / 16000
    pcm = (0.2 * 32767 * np.sin(2 * np.pi * 440 * t)).astype("<i2").tobytes()
    assert abs(dominant_frequency(pcm, 16000) - 440) < 2
    assert dominant_frequency(bytes(32000), 16000) is None


def test_tone_voice_speaks_each_word() -> None:
    speech = tone_voice("one two three")
    assert 0.3 < speech.size / 24000 < 1.5 and np.max(np.abs(speech)) > 0.2


@pytest.mark.usefixtures("espeak_ng")
def test_espeak_voice_speaks_the_answer() -> None:
    speech = espeak_voice("The newest frame is mostly red.")
    assert 1.0 < speech.size / 24000 < 5.0
    loud = np.abs(speech) > 0.05
    assert loud.mean() > 0.2 and not loud.all()  # speech with pauses, not a tone or silence


def _jpeg(rgb: np.ndarray) -> bytes:
    out = io.BytesIO()
    Image.fromarray(rgb).save(out, format="JPEG", quality=85)
    return out.getvalue()


def test_a_buffered_frame_is_seen_through_previews_that_agree_with_the_whole_image() -> None:
    rng = np.random.default_rng(1)
    rgb = np.zeros((480, 640, 3), np.uint8)
    rgb[:, :320] = (200, 30, 30)  # red left half, blue right half, noise on top
    rgb[:, 320:] = (20, 40, 190)
    rgb = np.clip(rgb + rng.normal(0, 6, rgb.shape), 0, 255).astype(np.uint8)
    frame = TurnFrame(frame_id=None, pts_ms=None, jpeg=_jpeg(rgb))
    assert frame.size == (640, 480)
    preview = frame.preview("RGB", 8)
    assert max(preview.shape[:2]) <= 80  # a 1/8-scale decode, not the whole image
    whole = frame.rgb.reshape(-1, 3).mean(axis=0)
    assert frame.rgb.shape == (480, 640, 3)
    assert np.abs(preview.reshape(-1, 3).mean(axis=0) - whole).max() < 2.0


def test_motion_is_zero_for_a_still_camera_and_large_for_a_moving_block() -> None:
    still = np.full((480, 640, 3), 90, np.uint8)
    moved = still.copy()
    moved[100:300, 100:300] = 250
    frames = [TurnFrame(frame_id=None, pts_ms=None, jpeg=_jpeg(x)) for x in (still, still, moved)]
    assert motion_score(frames[:2]) < 0.01
    assert motion_score(frames[1:]) > 0.05
