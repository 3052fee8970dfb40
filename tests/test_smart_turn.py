"""The end-of-turn model: its file found and checked inside the installed wheel, Whisper's
features, and its judgement of real (espeak-ng) speech."""

from __future__ import annotations

import socket
from pathlib import Path

import numpy as np
import pytest
from faster_whisper.feature_extractor import FeatureExtractor

from rtc_omni.client.media import speech48
from rtc_omni.engines import smart_turn
from rtc_omni.media.log_mel import log_mel
from rtc_omni.pcm import float_to_pcm16

COMPLETE = "What is the weather like in Paris today?"
PREFIX = "What is the weather like in"  # the model separates this pair clearly (docs/turn-taking.md)


def spoken16(text: str, pause_s: float = 0.35) -> np.ndarray:
    """espeak-ng saying `text` at 16 kHz, 300 ms of silence before and `pause_s` after."""
    return np.concatenate([np.zeros(4800), speech48(text)[::3], np.zeros(int(pause_s * 16_000))]).astype(np.float32)


def fake_wheel(root: Path, model: bytes | None) -> None:
    """A `pipecat-ai` distribution on `root` whose record lists the model file, with `model` as its
    content (None: the file is absent)."""
    info = root / "pipecat_ai-1.14.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: pipecat-ai\nVersion: 1.14.0\n")
    (info / "RECORD").write_text(f"{smart_turn.MODEL_FILE},,{smart_turn.MODEL_BYTES}\n")
    if model is not None:
        path = root / smart_turn.MODEL_FILE
        path.parent.mkdir(parents=True)
        path.write_bytes(model)


@pytest.mark.usefixtures("end_of_turn_model")  # skips without the [turn] extra, fails under CI
def test_the_model_file_is_the_published_one_inside_the_installed_wheel() -> None:
    path = smart_turn.model_file()
    assert path.name == "smart-turn-v3.2-cpu.onnx" and path.stat().st_size == smart_turn.MODEL_BYTES
    assert smart_turn.unavailable() is None


@pytest.mark.usefixtures("end_of_turn_model")
def test_a_corrupted_model_file_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    model = bytearray(smart_turn.model_file().read_bytes())
    model[len(model) // 2] ^= 0xFF
    fake_wheel(tmp_path, bytes(model))
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(smart_turn.TurnModelUnavailable, match=r"is not Smart Turn v3.2's: reinstall"):
        smart_turn.model_file()


def test_a_missing_model_file_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fake_wheel(tmp_path, None)
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(smart_turn.TurnModelUnavailable, match=r"is missing: reinstall .*rtc-omni\[turn\]"):
        smart_turn.model_file()


def test_the_features_are_whispers() -> None:
    rng = np.random.default_rng(5)
    audio = rng.normal(0, 0.1, 5 * 16_000).astype(np.float32)  # shorter than the window: padded in front
    ours = log_mel(audio, 8)
    window = np.concatenate([np.zeros(3 * 16_000, dtype=np.float32), audio])
    normalised = (window - window.mean()) / np.sqrt(window.var() + 1e-7)
    whisper = FeatureExtractor(chunk_length=8)(normalised, padding=0)
    assert ours.shape == whisper.shape == (80, 800)
    assert np.abs(ours - whisper).max() < 1e-4


@pytest.mark.usefixtures("espeak_ng", "end_of_turn_model")
def test_the_model_tells_a_finished_question_from_its_unfinished_start_without_the_network(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def no_network(*args: object, **kwargs: object) -> None:
        raise AssertionError("the end-of-turn model reached for the network")

    monkeypatch.setattr(socket, "socket", no_network)
    monkeypatch.setattr(socket, "create_connection", no_network)
    smart_turn._session.cache_clear()  # loaded here, under the guard
    finished = smart_turn.complete_probability(float_to_pcm16(spoken16(COMPLETE)))
    unfinished = smart_turn.complete_probability(float_to_pcm16(spoken16(PREFIX)))
    assert finished > 0.8 and unfinished < 0.3, (finished, unfinished)
