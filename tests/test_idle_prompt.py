"""Idle prompts (`turn_detection.idle_timeout_ms`): after that much silence the assistant speaks up,
once per silence, with OpenAI's `input_audio_buffer.timeout_triggered` over `WS /v1/realtime` (the
official SDK as the client, every event validated against its types) and the same setting in
vLLM-Omni's protocol."""

from __future__ import annotations

import base64
import re
from typing import Any

import pytest
from openai.types.realtime import InputAudioBufferTimeoutTriggered

from .conftest import RunningServer, WsFactory
from .realtime_client import Realtime, append_audio, connect, speech24k, text_of
from .wsclient import jpeg_b64

IDLE_MS = 1000
APPEND_MS = 200  # append_audio's pieces: the idle clock is checked as each is heard
RESAMPLER_MS = 5  # what the 24 -> 16 kHz resampler holds back of the audio appended so far


def silence24k(ms: int) -> bytes:
    return bytes(48 * ms)


async def idle_session(rt: Realtime, **detection: Any) -> dict[str, Any]:
    turn_detection = {"type": "server_vad", "idle_timeout_ms": IDLE_MS, **detection}
    await rt.send(
        {
            "type": "session.update",
            "session": {"output_modalities": ["text"], "audio": {"input": {"turn_detection": turn_detection}}},
        }
    )
    return (await rt.until("session.updated"))[-1]["session"]


def timeouts(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [e for e in events if e["type"] == "input_audio_buffer.timeout_triggered"]


async def test_silence_past_the_idle_timeout_prompts_once_with_openais_event(server: RunningServer) -> None:
    async with connect(server) as rt:
        updated = await idle_session(rt)
        await append_audio(rt, silence24k(3000))
        first = await rt.until("response.done")
        await append_audio(rt, silence24k(1600))
        second = await rt.until("response.done")

    assert updated["audio"]["input"]["turn_detection"]["idle_timeout_ms"] == IDLE_MS
    (fired,) = timeouts(first)  # once, though the silence went on for three timeouts
    typed = InputAudioBufferTimeoutTriggered.model_validate(fired)
    assert typed.audio_start_ms == 0  # the silence began with the session's turn detection
    assert IDLE_MS <= typed.audio_end_ms - typed.audio_start_ms <= IDLE_MS + APPEND_MS
    types = [e["type"] for e in first]
    assert types[types.index(fired["type"]) :][:5] == [
        "input_audio_buffer.timeout_triggered",
        "input_audio_buffer.committed",
        "conversation.item.added",
        "conversation.item.done",
        "response.created",
    ]
    committed = first[types.index("input_audio_buffer.committed")]
    assert committed["item_id"] == typed.item_id
    heard = re.search(r"I heard ([\d.]+) seconds of silence", text_of(first, "response.output_text.delta"))
    assert heard is not None and abs(float(heard.group(1)) * 1000 - (typed.audio_end_ms - typed.audio_start_ms)) <= 20
    # The next silence starts when the prompt's answer ended, after all 3 s had been heard.
    (again,) = timeouts(second)
    assert abs(again["audio_start_ms"] - 3000) <= RESAMPLER_MS
    assert IDLE_MS <= again["audio_end_ms"] - again["audio_start_ms"] <= IDLE_MS + APPEND_MS


@pytest.mark.usefixtures("espeak_ng")  # skips without espeak-ng, fails under CI
async def test_after_a_spoken_answer_the_silence_counts_from_when_its_audio_has_played(server: RunningServer) -> None:
    speech = speech24k("What colour is this?")
    async with connect(server) as rt:
        await idle_session(rt, silence_duration_ms=500)
        await rt.send({"type": "session.update", "session": {"output_modalities": ["audio"]}})
        await rt.until("session.updated")
        heard_ms = 300 + len(speech) // 48 + 700
        await append_audio(rt, silence24k(300) + speech + silence24k(700))
        answer = await rt.until("response.done")
        spoken = b"".join(base64.b64decode(e["delta"]) for e in answer if e["type"] == "response.output_audio.delta")
        spoken_ms = len(spoken) // 48
        await append_audio(rt, silence24k(spoken_ms + IDLE_MS + 400))
        prompt = await rt.until("response.done")

    assert not timeouts(answer) and [e["type"] for e in answer].count("input_audio_buffer.speech_started") == 1
    assert spoken_ms > 1000
    (fired,) = timeouts(prompt)
    # Over WebSocket the client plays the answer after response.done: the silence starts once it has.
    assert abs(fired["audio_start_ms"] - (heard_ms + spoken_ms)) <= RESAMPLER_MS + 20


async def test_vllm_omni_protocol_prompts_a_silent_user_once(server: RunningServer, make_ws: WsFactory) -> None:
    client = await make_ws(server, "/v1/video/chat/stream")
    config = {"modalities": ["text"], "turn_detection": {"type": "server_vad", "idle_timeout_ms": IDLE_MS}}
    await client.send({"type": "session.config", **config})
    await client.send({"type": "video.frame", "data": jpeg_b64((20, 200, 40)), "frame_id": "f1"})
    await client.wait_event("video.frame.ack")
    for _ in range(15):  # 3 s of silence, 200 ms a chunk
        await client.send({"type": "audio.chunk", "data": base64.b64encode(bytes(6400)).decode()})
    done = await client.wait_event("response.text.done", timeout=20)

    fired = [e for e in client.events if e["type"] == "input_audio.timeout_triggered"]
    assert len(fired) == 1 and fired[0]["audio_start_ms"] == 0
    assert IDLE_MS <= fired[0]["audio_end_ms"] <= IDLE_MS + APPEND_MS
    types = [e["type"] for e in client.events]
    assert types.index("input_audio.timeout_triggered") < types.index("response.start")
    assert re.search(r"I heard 1\.[0-9]+ seconds of silence", done["text"]), done["text"]
    assert "mostly green" in done["text"]


async def test_an_idle_timeout_under_a_second_is_refused(server: RunningServer) -> None:
    async with connect(server) as rt:
        await rt.send(
            {
                "type": "session.update",
                "event_id": "evt_idle",
                "session": {"audio": {"input": {"turn_detection": {"type": "server_vad", "idle_timeout_ms": 200}}}},
            }
        )
        error = await rt.next()

    assert error["type"] == "error" and error["error"]["code"] == "invalid_value"
    assert error["error"]["param"] == "session.audio.input.turn_detection.idle_timeout_ms"
