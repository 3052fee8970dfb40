"""Realtime calls through a gateway (`--engine remote`) in front of vLLM-Omni 0.30's genuine duplex
`/v1/realtime`: its own `OmniDuplexSessionHandler` and Qwen3-Omni session stack, with only the model
faked (tests/vllm_cpu/fake_duplex.py). The fake's answer says what its prompt held ("heard N ms of
audio; images: K; history: ..."), so a test reads the upstream's context back from what the client
hears; `GET /test/record` says what the upstream was asked, and when (time.monotonic(), one clock
for every process here)."""

from __future__ import annotations

import asyncio
import base64
import time
from collections.abc import Iterator
from typing import Any

import aiohttp
import pytest

from .conftest import ClientFactory, RunningServer, ServerFactory
from .genuine import Genuine, Vanishing, gateway_to
from .realtime_client import Realtime, add_user_text, append_audio, connect, text_of, tone_pcm24k
from .test_realtime_calls import Call, stats_until
from .test_realtime_calls import call as call  # the fixture

pytestmark = pytest.mark.slow  # a vLLM-Omni server in a subprocess

TRANSCRIPT = "response.output_audio_transcript.delta"


@pytest.fixture(scope="module")
def duplex() -> Iterator[Genuine]:
    # Speech generated in real time (a 0.2 s chunk every 0.2 s), as a GPU serving many sessions does:
    # an answer is still being generated while its first words play.
    server = Genuine("--kind", "realtime", "--max-sessions", "8", "--chunk-interval", "0.2")
    yield server
    server.stop()


async def front(make_server: ServerFactory, upstream: str, **overrides: Any) -> RunningServer:
    return await gateway_to(make_server, upstream, upstream_protocol="realtime", **overrides)


async def voice_only(rt: Realtime) -> None:
    update = {"type": "realtime", "audio": {"input": {"turn_detection": None}}}
    await rt.send({"type": "session.update", "session": update})
    await rt.until("session.updated")


async def spoken_turn(rt: Realtime, seconds: float) -> list[dict[str, Any]]:
    await append_audio(rt, tone_pcm24k(330, seconds))
    await rt.send({"type": "input_audio_buffer.commit"})
    return await rt.respond()


def commands(record: dict[str, list[Any]], kind: str) -> list[dict[str, Any]]:
    return [c for c in record["commands"] if c["type"] == kind]


async def raw_turn(ws: aiohttp.ClientWebSocketResponse, seconds: float) -> dict[str, Any]:
    """A voice turn as a plain client sends it; the `response` of its `response.done`."""
    await ws.send_json(
        {"type": "input_audio_buffer.append", "audio": base64.b64encode(tone_pcm24k(220, seconds)).decode()}
    )
    await ws.send_json({"type": "input_audio_buffer.commit"})
    await ws.send_json({"type": "response.create"})
    while (event := await ws.receive_json(timeout=20))["type"] not in ("response.done", "error"):
        pass
    assert event["type"] == "response.done", event
    return event["response"]


async def test_the_fake_upstream_itself_answers_a_voice_turn_with_the_earlier_turn_as_context(duplex: Genuine) -> None:
    """The harness without a gateway: what the other tests read back is the upstream's own context."""
    async with aiohttp.ClientSession() as http, http.ws_connect(duplex.url + "/v1/realtime?model=any") as ws:
        created = await ws.receive_json(timeout=20)
        assert created["type"] == "session.created" and created["resume_token"]
        pcm = {"type": "audio/pcm", "rate": 24_000}  # its input default is 16 kHz
        audio = {"input": {"format": pcm, "turn_detection": None}, "output": {"format": pcm}}
        await ws.send_json({"type": "session.update", "session": {"audio": audio}})

        first = await raw_turn(ws, 1.0)
        assert first["status"] == "completed"
        assert "heard 1000 ms of audio" in first["output"][0]["content"][0]["transcript"]
        heard = {"response_id": first["id"], "item_id": first["output"][0]["id"], "played_ms": 10**6}
        await ws.send_json({"type": "playback.ack", **heard})  # all of it was played
        second = await raw_turn(ws, 0.5)
        assert "history: user audio 1000 ms | assistant 'Answer" in second["output"][0]["content"][0]["transcript"]
        await ws.send_json({"type": "session.close"})
    session = created["session"]["id"]
    record = await duplex.record()
    kinds = [c["type"] for c in record["commands"] if c["session_id"] == session]
    assert kinds.count("Commit") == 2 and kinds.count("CreateResponse") == 2 and "AckPlayback" in kinds
    assert [r["audio_ms"] for r in record["requests"] if r["session_id"] == session] == [[1000], [1000, 500]]


async def test_a_voice_only_sdk_call_is_answered_with_the_conversation_kept_upstream(
    duplex: Genuine, make_server: ServerFactory
) -> None:
    server = await front(make_server, duplex.url)
    async with connect(server) as rt:
        await voice_only(rt)
        first = await spoken_turn(rt, 1.0)
        assert first[-1]["response"]["status"] == "completed"
        assert "heard 1000 ms of audio" in text_of(first, TRANSCRIPT)
        assert any(e["type"] == "response.output_audio.delta" for e in first)

        await add_user_text(rt, "And what did you hear?")
        second = await rt.respond()
        said = text_of(second, TRANSCRIPT)
        # The upstream's own history: the spoken turn (its audio, committed there), its answer, the question.
        assert "history: user audio 1000 ms | assistant 'Answer" in said and "user 'And what did you hear?'" in said
    assert not [e for e in rt.events if e["type"] == "error"]  # and every event validated against the SDK


async def test_a_webrtc_call_hears_the_answer_and_its_cancel_and_truncation_reach_the_upstream(
    duplex: Genuine, make_server: ServerFactory, call: Call
) -> None:
    server = await front(make_server, duplex.url)
    await call.connect(server, {"type": "realtime", "audio": {"input": {"turn_detection": None}}})
    await stats_until(server, call, lambda s: s["audio_ms_buffered"] >= 1000 and s["camera_frames"] >= 1)
    call.send({"type": "input_audio_buffer.commit"})  # the microphone's tone, and the camera's view
    call.send({"type": "response.create"})
    assert call.recorder is not None
    async with asyncio.timeout(20):
        while call.recorder.voiced_frames() < 25:  # half a second of speech heard
            await asyncio.sleep(0.02)
    sent = time.monotonic()
    call.send({"type": "response.cancel"})
    done = await call.wait("response.done")
    truncated = await call.wait("conversation.item.truncated")
    assert done["response"]["status"] == "cancelled"

    record = await duplex.wait_record(lambda r: bool(commands(r, "TruncateItem")))
    cancels = [c for c in commands(record, "CancelResponse") if c["t"] > sent]
    assert cancels and cancels[0]["t"] < done["_at"]  # the upstream stopped before the client was told
    # The upstream's answer is cut to what the talker sent, as the gateway's own item is ...
    assert commands(record, "TruncateItem")[-1]["audio_end_ms"] == truncated["audio_end_ms"]
    call.send({"type": "conversation.item.retrieve", "item_id": truncated["item_id"]})
    heard = (await call.wait("conversation.item.retrieved"))["item"]["content"][0]["transcript"]
    assert heard.startswith("Answer") and "heard" in done["response"]["output"][0]["content"][0]["transcript"]
    # ... and the model remembers the words the user heard.
    mark = len(call.events)
    call.send(
        {
            "type": "conversation.item.create",
            "item": {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Go on."}]},
        }
    )
    call.send({"type": "response.create"})
    after = await call.wait("response.done", after=mark)
    said = after["response"]["output"][0]["content"][0]["transcript"]
    assert f"assistant '{' '.join(heard.split()[:6])}" in said, (heard, said)
    assert "user image 320x240" in said and "user audio" in said  # the camera's view, the microphone's turn


async def test_a_dropped_upstream_socket_is_resumed_and_the_conversation_goes_on(
    duplex: Genuine, make_server: ServerFactory
) -> None:
    link = Vanishing(duplex)
    server = await front(make_server, await link.start())
    async with connect(server) as rt:
        await voice_only(rt)
        await spoken_turn(rt, 0.5)
        await link.drop()  # the gateway's socket to the upstream goes, as on a network change

        await add_user_text(rt, "Still there?")
        events = await rt.respond()
        assert events[-1]["response"]["status"] == "completed"
        said = text_of(events, TRANSCRIPT)
        assert "history: user audio 500 ms | assistant 'Answer" in said  # the same upstream session
    assert not [e for e in rt.events if e["type"] == "error"]
    record = await duplex.record()
    assert [c for c in record["controls"] if c["op"] == "resume_duplex_session"]
    await link.vanish()


async def test_an_understanding_session_holds_its_conversation_upstream_too_when_told_to(
    duplex: Genuine, make_server: ServerFactory, make_client: ClientFactory
) -> None:
    """`--upstream-protocol realtime`: vLLM-Omni's older protocol towards the peer, `/v1/realtime` upstream."""
    server = await front(make_server, duplex.url)
    client = await make_client(server, colour="red", tone=440.0, config={"system_prompt": "Be brief."})
    await client.wait_event("video.frame.ack")
    await asyncio.sleep(1.0)  # some microphone audio for the first turn

    first = await client.ask("what is this?")
    second = await client.ask("and now?")

    assert not first.errors and "heard" in first.text and "images: 1" in first.text
    assert client.recorder is not None and client.recorder.voiced_frames(first.sent_at, first.done_at) > 10
    # The upstream remembers the first exchange: the camera's image, the question, the answer.
    assert "user image" in second.text and "user 'what is this?'" in second.text
    assert "assistant 'Answer" in second.text and not second.errors
    record = await duplex.record()  # the system prompt is the upstream session's instructions
    assert [r for r in record["requests"] if r["instructions"] == "Be brief."]
