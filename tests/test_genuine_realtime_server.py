"""The genuine duplex `/v1/realtime` test server (tests/vllm_cpu/genuine_server.py --kind realtime):
vLLM-Omni 0.30's own handler and Qwen3-Omni session stack with a fake model answers a voice-only
turn in speech, and its next answer names the earlier turn as context.
"""

from __future__ import annotations

import base64
import math
import struct
from typing import Any

import aiohttp
import pytest

from .test_bridge_genuine import Genuine

pytestmark = pytest.mark.slow  # a vLLM-Omni server in a subprocess

RATE = 24_000  # audio/pcm both ways; the handler's input default is 16 kHz, so the session names 24 kHz


def _speech(seconds: float) -> str:
    samples = (int(8000 * math.sin(2 * math.pi * 220 * n / RATE)) for n in range(int(seconds * RATE)))
    return base64.b64encode(b"".join(struct.pack("<h", s) for s in samples)).decode()


async def _until_done(ws: aiohttp.ClientWebSocketResponse) -> list[dict[str, Any]]:
    events: list[dict[str, Any]] = []
    while not events or events[-1]["type"] not in ("response.done", "error"):
        events.append(await ws.receive_json(timeout=20))
    return events


async def _voice_turn(ws: aiohttp.ClientWebSocketResponse, seconds: float) -> list[dict[str, Any]]:
    await ws.send_json({"type": "input_audio_buffer.append", "audio": _speech(seconds)})
    await ws.send_json({"type": "input_audio_buffer.commit"})
    await ws.send_json({"type": "response.create"})
    return await _until_done(ws)


async def test_a_voice_turn_is_answered_in_speech_and_the_next_answer_has_it_as_context() -> None:
    server = Genuine("--kind", "realtime", "--model", "qwen3-omni-fake")
    try:
        async with aiohttp.ClientSession() as http:
            async with http.ws_connect(server.url + "/v1/realtime?model=qwen3-omni-fake") as ws:
                created = await ws.receive_json(timeout=20)
                assert created["type"] == "session.created" and created["resume_token"]
                pcm = {"type": "audio/pcm", "rate": RATE}
                audio = {"input": {"format": pcm, "turn_detection": None}, "output": {"format": pcm}}
                await ws.send_json({"type": "session.update", "session": {"audio": audio}})  # turns committed by us

                first = await _voice_turn(ws, 1.0)
                done = first[-1]["response"]
                assert done["status"] == "completed"
                transcript = done["output"][0]["content"][0]["transcript"]
                assert "heard 1000 ms of audio" in transcript
                speech = b"".join(
                    base64.b64decode(e["delta"]) for e in first if e["type"] == "response.output_audio.delta"
                )
                assert len(speech) // 2 == done["output"][0]["content"][0]["audio_duration_ms"] * RATE // 1000 > 0

                heard = {"response_id": done["id"], "item_id": done["output"][0]["id"], "played_ms": 10**6}
                await ws.send_json({"type": "playback.ack", **heard})  # all of it was played
                second = (await _voice_turn(ws, 0.5))[-1]["response"]
                context = second["output"][0]["content"][0]["transcript"]
                assert "history: user audio 1000 ms | assistant 'Answer" in context
                await ws.send_json({"type": "session.close"})
        record = await server.record()
        kinds = [command["type"] for command in record["commands"]]
        assert kinds.count("Commit") == 2 and kinds.count("CreateResponse") == 2 and "AckPlayback" in kinds
        assert [request["audio_ms"] for request in record["requests"]] == [[1000], [1000, 500]]
    finally:
        server.stop()
