"""A realtime call through a gateway (`--engine remote`) whose upstream speaks OpenAI Realtime: here
another rtc-omni on the synthetic engine, as an engine process of `--workers` is. The client is the
official SDK (every event validated against its union); what the upstream was asked is read from
its own session. vLLM-Omni's genuine duplex handler: tests/test_realtime_upstream_genuine.py."""

from __future__ import annotations

import base64
import json
import re

from aiohttp import web
from aiohttp.test_utils import TestServer

from rtc_omni.sessions.realtime import RealtimeSession
from rtc_omni.signaling.websocket import WebSocketSession

from .conftest import RunningServer, ServerFactory
from .genuine import Vanishing, gateway_to
from .realtime_client import Realtime, add_user_text, append_audio, connect, text_of, tone_pcm24k
from .test_bridge import gateway
from .waiting import wait_until

TRANSCRIPT = "response.output_audio_transcript.delta"


def upstream_binding(backend: RunningServer) -> WebSocketSession:
    """The upstream's one WebSocket session."""
    found = [backend.registry.get(i) for i in backend.registry]
    assert len(found) == 1 and isinstance(found[0], WebSocketSession), found
    return found[0]


def upstream_session(backend: RunningServer) -> RealtimeSession:
    session = upstream_binding(backend).session
    assert isinstance(session, RealtimeSession)
    return session


def earlier_items(events: list[dict]) -> int:
    """How many earlier items the upstream's synthetic engine was given (it says so)."""
    said = re.search(r"I was given (\d+) earlier conversation items", text_of(events, TRANSCRIPT))
    return int(said.group(1)) if said else 0


async def voice_only(rt: Realtime) -> None:
    update = {"type": "realtime", "audio": {"input": {"turn_detection": None}}}
    await rt.send({"type": "session.update", "session": update})
    await rt.until("session.updated")


async def test_a_voice_only_call_is_answered_with_the_conversation_mirrored_upstream(
    make_server: ServerFactory,
) -> None:
    backend = await make_server()
    server = await gateway(make_server, backend)
    async with connect(server) as rt:
        await voice_only(rt)
        await append_audio(rt, tone_pcm24k(330, 1.0))
        await rt.send({"type": "input_audio_buffer.commit"})
        first = await rt.respond()
        assert first[-1]["response"]["status"] == "completed"
        assert "I heard 1.00 seconds of audio, dominant frequency about 330 Hz" in text_of(first, TRANSCRIPT)
        assert any(e["type"] == "response.output_audio.delta" for e in first)
        assert first[-1]["response"]["usage"]["input_token_details"]["audio_tokens"] > 0

        await add_user_text(rt, "And the second question?")
        second = await rt.respond()
        assert earlier_items(second) == 2  # the spoken question and its answer, not sent again

        spoken = next(e["item_id"] for e in first if e["type"] == "input_audio_buffer.committed")
        await rt.send({"type": "conversation.item.delete", "item_id": spoken})
        await rt.until("conversation.item.deleted")
        await add_user_text(rt, "And the third?")
        third = await rt.respond()
        assert earlier_items(third) == 3  # the first answer, the second question and answer

        upstream = upstream_session(backend)
        assert len(upstream._conversation) == 5  # noqa: SLF001 - what the upstream holds
    assert rt.events, "every event validated against the SDK's union"


async def test_cancel_and_truncation_reach_the_upstream(make_server: ServerFactory) -> None:
    backend = await make_server(synthetic_audio_speed=1.0)  # speech generated in real time: cancellable
    server = await gateway(make_server, backend)
    async with connect(server) as rt:
        await voice_only(rt)
        await add_user_text(rt, "Tell me a long story.")
        await rt.send({"type": "response.create"})
        await rt.until("response.output_audio.delta")
        await rt.send({"type": "response.cancel"})
        done = await rt.until("response.done")
        assert done[-1]["response"]["status"] == "cancelled"
        upstream = upstream_session(backend)
        await wait_until(lambda: upstream.responses["cancelled"] == 1, timeout=5)

        await add_user_text(rt, "Now a short one.")
        events = await rt.respond()
        answer = next(e["item"]["id"] for e in events if e["type"] == "response.output_item.added")
        truncate = {"type": "conversation.item.truncate", "item_id": answer, "content_index": 0}
        await rt.send({**truncate, "audio_end_ms": 300})
        await rt.until("conversation.item.truncated")

        def upstream_answer_ms() -> float:
            last = list(upstream._conversation)[-1]  # noqa: SLF001 - what the upstream holds
            return len(last.parts[0].audio) / 48.0  # 24 kHz PCM16

        await wait_until(lambda: round(upstream_answer_ms()) == 300, timeout=5)


async def test_a_lost_upstream_session_is_replaced_with_the_conversation_replayed(make_server: ServerFactory) -> None:
    backend = await make_server()
    server = await gateway(make_server, backend)
    async with connect(server) as rt:
        await voice_only(rt)
        await add_user_text(rt, "First question.")
        await rt.respond()
        await upstream_binding(backend).close()  # the upstream drops the session (an OpenAI server cannot resume)
        await wait_until(lambda: len(backend.registry) == 0, timeout=5)

        await add_user_text(rt, "Second question.")
        events = await rt.respond()
        assert events[-1]["response"]["status"] == "completed"
        assert earlier_items(events) == 2  # the first question and answer, replayed as text
        assert not [e for e in rt.events if e["type"] == "error"]


async def test_a_dropped_upstream_socket_is_resumed_with_the_same_upstream_session(make_server: ServerFactory) -> None:
    backend = await make_server()
    link = Vanishing(backend)  # the network between the gateway and its upstream
    server = await gateway_to(make_server, await link.start())
    async with connect(server) as rt:
        await voice_only(rt)
        await add_user_text(rt, "First question.")
        await rt.respond()
        held = upstream_binding(backend)
        await link.drop()  # no closing handshake: the upstream keeps the session for its grace
        await wait_until(lambda: not held.resumable.attached if held.resumable else False, timeout=5)

        await add_user_text(rt, "Second question.")
        events = await rt.respond()
        assert events[-1]["response"]["status"] == "completed"
        assert earlier_items(events) == 2
        assert upstream_binding(backend) is held  # resumed, not replaced: nothing was sent again
        assert (await held.stats())["resumes"] == 1
        assert not [e for e in rt.events if e["type"] == "error"]


async def test_an_upstream_that_sends_broken_audio_fails_that_response_and_the_call_goes_on(
    make_server: ServerFactory,
) -> None:
    """A hostile or broken upstream: audio that is not base64 fails its response with the reason; the
    next response is answered."""
    answers = iter(["not base64!", base64.b64encode(b"\x00\x10" * 2400).decode()])

    async def upstream(request: web.Request) -> web.WebSocketResponse:
        ws = web.WebSocketResponse()
        await ws.prepare(request)
        await ws.send_json({"type": "session.created", "session": {"id": "sess_1"}})
        async for message in ws:
            event = json.loads(message.data)
            if event["type"] == "session.update":
                await ws.send_json({"type": "session.updated", "session": {}})
            elif event["type"] == "conversation.item.create":
                await ws.send_json({"type": "conversation.item.added", "item": {"id": f"up_{id(event)}"}})
            elif event["type"] == "response.create":
                await ws.send_json({"type": "response.output_item.added", "response_id": "r", "item": {"id": "a"}})
                await ws.send_json({"type": "response.output_audio.delta", "delta": next(answers)})
                await ws.send_json({"type": "response.done", "response": {"status": "completed"}})
        return ws

    app = web.Application()
    app.router.add_get("/v1/realtime", upstream)
    fake = TestServer(app, host="127.0.0.1", port=0)
    await fake.start_server()
    try:
        server = await gateway_to(make_server, str(fake.make_url("")).rstrip("/").replace("http://", "ws://"))
        async with connect(server) as rt:
            await add_user_text(rt, "Hello?")
            broken = (await rt.respond())[-1]["response"]
            assert broken["status"] == "failed"
            assert "the upstream sent audio that is not base64" in broken["status_details"]["error"]["message"]
            await add_user_text(rt, "Hello again?")
            events = await rt.respond()
            assert events[-1]["response"]["status"] == "completed"
            assert any(e["type"] == "response.output_audio.delta" for e in events)
    finally:
        await fake.close()
