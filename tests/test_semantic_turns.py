"""Semantic turn detection in whole sessions, on espeak-ng speech and the real end-of-turn model.

Positions are audio time, as the VAD counts them: a client that appends a sentence and 800 ms of
silence, and nothing more, gets its commit only if a pause within those 800 ms ended the turn.
The model separates "What is the weather like in Paris today?" (finished) from "What is the
weather like in" (unfinished) clearly; it misjudges some other robotic phrases, and is less sure
of the sentence broken by a 1.5 s pause (docs/turn-taking.md), so the one-turn tests let the
turn end by the model or by the cap: one turn either way.
"""

from __future__ import annotations

import base64
import re

import pytest

from rtc_omni.media.pcm_resample import convert
from rtc_omni.sessions.turn_taking import CAP_MS

from .conftest import RunningServer, ServerFactory, WsFactory
from .realtime_client import Realtime, append_audio, connect, speech24k, text_of
from .wsclient import jpeg_b64

pytestmark = pytest.mark.usefixtures("espeak_ng")

COMPLETE = "What is the weather like in Paris today?"
PREFIX, REST = "What is the weather like in", "Paris today?"
CAP_S = CAP_MS["high"] / 1000  # the eagerness these tests ask for


def silence24k(seconds: float) -> bytes:
    return bytes(int(seconds * 24_000) * 2)


def seconds24k(pcm: bytes) -> float:
    return len(pcm) / 48_000


def speech16k(text: str) -> bytes:
    """espeak-ng saying `text` as the 16 kHz PCM16 of vLLM-Omni's `audio.chunk`."""
    return convert(speech24k(text), 24_000, 16_000)


def silence16k(seconds: float) -> bytes:
    return bytes(int(seconds * 16_000) * 2)


async def semantic(rt: Realtime, eagerness: str = "high") -> dict:
    detection = {"type": "semantic_vad", "eagerness": eagerness}
    await rt.send({"type": "session.update", "session": {"audio": {"input": {"turn_detection": detection}}}})
    return (await rt.until("session.updated"))[-1]["session"]["audio"]["input"]["turn_detection"]


@pytest.mark.usefixtures("end_of_turn_model")  # skips without the [turn] extra, fails under CI
async def test_a_finished_question_commits_within_800_ms_of_its_end(server: RunningServer) -> None:
    speech = speech24k(COMPLETE)
    async with connect(server) as rt:
        detection = await semantic(rt)
        await append_audio(rt, silence24k(0.5) + speech + silence24k(0.8))
        events = await rt.until("input_audio_buffer.committed")

    assert detection == {**detection, "type": "semantic_vad", "eagerness": "high"}
    stopped = next(e for e in events if e["type"] == "input_audio_buffer.speech_stopped")
    assert abs(stopped["audio_end_ms"] / 1000 - (0.5 + seconds24k(speech))) < 0.15


@pytest.mark.usefixtures("end_of_turn_model")  # skips without the [turn] extra, fails under CI
async def test_a_pause_inside_a_sentence_keeps_one_user_turn(server: RunningServer) -> None:
    prefix, rest = speech24k(PREFIX), speech24k(REST)
    async with connect(server) as rt:
        await semantic(rt)
        await append_audio(rt, silence24k(0.5) + prefix + silence24k(1.5) + rest + silence24k(CAP_S + 0.4))
        events = await rt.until("response.done")
        events += await rt.until_quiet(1.0)

    types = [e["type"] for e in events]
    assert types.count("input_audio_buffer.speech_started") == 1
    assert types.count("input_audio_buffer.committed") == 1 and types.count("response.created") == 1
    heard = re.search(r"I heard ([\d.]+) seconds of audio", text_of(events, "response.output_audio_transcript.delta"))
    spoken = seconds24k(prefix) + 1.5 + seconds24k(rest)
    assert heard is not None and abs(float(heard.group(1)) - (spoken + 0.3)) <= 0.2  # + prefix padding


@pytest.mark.usefixtures("end_of_turn_model")  # skips without the [turn] extra, fails under CI
async def test_an_unfinished_sentence_commits_at_the_eagerness_cap(server: RunningServer) -> None:
    prefix = speech24k(PREFIX)
    async with connect(server) as rt:
        await semantic(rt)
        await append_audio(rt, silence24k(0.5) + prefix + silence24k(CAP_S - 0.4))
        held = await rt.until_quiet(1.5)
        await append_audio(rt, silence24k(0.8))
        events = await rt.until("input_audio_buffer.committed")

    assert [e["type"] for e in held] == ["input_audio_buffer.speech_started"]
    stopped = next(e for e in events if e["type"] == "input_audio_buffer.speech_stopped")
    assert abs(stopped["audio_end_ms"] / 1000 - (0.5 + seconds24k(prefix))) < 0.15


async def test_without_the_model_semantic_vad_says_so_and_commits_on_silence(make_server: ServerFactory) -> None:
    server = await make_server(end_of_turn_model="none")
    async with connect(server) as rt:
        detection = {"type": "semantic_vad", "eagerness": "low"}
        await rt.send(
            {
                "type": "session.update",
                "event_id": "evt_semantic",
                "session": {"audio": {"input": {"turn_detection": detection}}},
            }
        )
        updated, error = await rt.next(), await rt.next()
        await append_audio(rt, silence24k(0.5) + speech24k(PREFIX) + silence24k(1.2))
        events = await rt.until("input_audio_buffer.committed")

    reported = updated["session"]["audio"]["input"]["turn_detection"]
    assert (reported["type"], reported["silence_duration_ms"]) == ("server_vad", 1000)
    assert (error["error"]["code"], error["error"]["event_id"]) == ("semantic_vad_unavailable", "evt_semantic")
    assert error["error"]["param"] == "session.audio.input.turn_detection.type"
    assert "input_audio_buffer.speech_stopped" in [e["type"] for e in events]


@pytest.mark.usefixtures("end_of_turn_model")  # skips without the [turn] extra, fails under CI
async def test_the_legacy_protocol_keeps_one_turn_across_a_pause(server: RunningServer, make_ws: WsFactory) -> None:
    client = await make_ws(server, "/v1/video/chat/stream")
    detection = {"type": "semantic_vad", "eagerness": "high"}
    await client.send({"type": "session.config", "modalities": ["text"], "turn_detection": detection})
    await client.send({"type": "video.frame", "data": jpeg_b64((230, 20, 20)), "frame_id": "f1"})
    await client.wait_event("video.frame.ack")
    audio = b"".join((silence16k(0.5), speech16k(PREFIX), silence16k(1.5), speech16k(REST), silence16k(CAP_S + 0.4)))
    for start in range(0, len(audio), 6400):  # 200 ms chunks
        await client.send({"type": "audio.chunk", "data": base64.b64encode(audio[start : start + 6400]).decode()})
    done = await client.wait_event("response.text.done", timeout=20)

    starts = [e for e in client.events if e["type"] == "response.start"]
    assert len(starts) == 1 and [e["type"] for e in client.events].count("input_audio.speech_started") == 1
    lasted = float(re.search(r"speech segment lasted ([\d.]+) seconds", done["text"]).group(1))
    spoken = len(speech16k(PREFIX)) / 32_000 + 1.5 + len(speech16k(REST)) / 32_000
    assert abs(lasted - spoken) <= 0.15


async def test_without_the_model_the_legacy_protocol_says_so(make_server: ServerFactory, make_ws: WsFactory) -> None:
    server = await make_server(end_of_turn_model="none")
    client = await make_ws(server, "/v1/video/chat/stream")
    await client.send({"type": "session.config", "turn_detection": {"type": "semantic_vad", "eagerness": "high"}})
    error = await client.wait_event("error")

    assert error["code"] == "semantic_vad_unavailable" and "pip install 'rtc-omni[turn]'" in error["detail"]
    session = server.registry.get(next(iter(server.registry))).session
    assert session.stats()["turn_detection"] == "server_vad"
