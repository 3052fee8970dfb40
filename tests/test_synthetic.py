"""engines/synthetic.py: what the embedded engine measures in frames and audio, and its voices."""

from __future__ import annotations

import numpy as np
import pytest

from rtc_omni.engines.synthetic import colour_name, dominant_frequency, espeak_voice, tone_voice


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
