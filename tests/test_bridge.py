"""The bridge: an aiortc peer -> a gateway rtc-omni (`--engine remote`) -> backend rtc-omni servers
speaking vLLM-Omni's WebSocket protocols on the synthetic engine, all on 127.0.0.1."""

from __future__ import annotations

import asyncio
import base64
import io
import json
import re
import socket
import time
import wave
from collections.abc import AsyncIterator

import numpy as np
import pytest
import simplejpeg
from aiohttp import web
from aiohttp.test_utils import TestServer

from rtc_omni.client.rtc_peers import GenerateClient
from rtc_omni.engines import (
    AudioChunk,
    EngineError,
    RemoteUnderstandEngine,
    SyntheticEngine,
    TextDelta,
    TurnFrame,
    UnderstandOutput,
    UnderstandTurn,
    UpstreamPool,
)
from rtc_omni.signaling.keys import ENGINES

from .conftest import ClientFactory, RunningServer, ServerFactory
from .generate_client import received_through
from .genuine import gateway_to


class CountingEngine(SyntheticEngine):
    """The synthetic engine, counting the turns it answered."""

    def __init__(self) -> None:
        super().__init__(ttft=0.05, token_rate=200.0, audio_speed=8.0, voice="tone")
        self.turns = 0

    async def generate(self, turn: UnderstandTurn) -> AsyncIterator[UnderstandOutput]:
        self.turns += 1
        async for output in super().generate(turn):
            yield output


def ws_url(server: RunningServer) -> str:
    return server.url.replace("http://", "ws://")


async def gateway(make_server: ServerFactory, *backends: RunningServer, **overrides: object) -> RunningServer:
    return await gateway_to(make_server, *[ws_url(b) for b in backends], **overrides)


def _accepted(event: dict) -> bool:
    return event.get("type") == "video.frame.ack" and event["accepted"]


async def test_a_bridged_peer_gets_answers_about_its_camera_and_hears_them(
    make_server: ServerFactory, make_client: ClientFactory
) -> None:
    backend = await make_server(spoken_sentences=1)
    front = await gateway(make_server, backend)
    client = await make_client(front, colour="red", tone=440.0, config={})
    await client.wait_event(where=_accepted)
    await asyncio.sleep(1.0)

    result = await client.ask("What colour is the camera showing?")

    assert not result.errors and "mostly red" in result.text
    hz = float(re.search(r"dominant frequency about (\d+) Hz", result.text).group(1))
    assert 430 <= hz <= 450
    assert result.events[-1]["type"] == "response.audio.done"
    assert client.recorder is not None and client.recorder.voiced_frames(result.sent_at, result.done_at) > 25


async def test_a_bridged_interrupt_cancels_the_upstream_turn(
    make_server: ServerFactory, make_client: ClientFactory
) -> None:
    backend = await make_server(synthetic_ttft=0.8, synthetic_audio_speed=2.0, spoken_sentences=1)
    front = await gateway(make_server, backend)
    client = await make_client(front, colour="blue", tone=None, config={})
    await client.wait_event(where=_accepted)
    mark = len(client.events)
    client.send({"type": "video.query", "text": "talk to me"})
    first = await client.wait_event("response.start", after=mark)
    async with asyncio.timeout(15):
        while client.recorder.voiced_frames(since=time.monotonic() - 0.1) == 0:
            await asyncio.sleep(0.02)

    mark = len(client.events)
    second = await client.ask("another question", timeout=30)

    cancelled = next(e for e in client.events[mark:] if e["type"] == "response.cancelled")
    assert cancelled["request_id"] == first["request_id"]
    assert "mostly blue" in second.text and 'You asked: "another question".' in second.text
    async with asyncio.timeout(5):  # the upstream saw the socket close and aborted its request
        while not backend.engine.recent_aborts:
            await asyncio.sleep(0.05)


@pytest.mark.media
async def test_bridged_generation_arrives_in_order_and_reports_the_upstreams_interactions(
    make_server: ServerFactory,
) -> None:
    backend = await make_server(
        synthetic_chunk_frames=10, synthetic_first_chunk_latency=0.2, synthetic_chunk_latency=0.25
    )
    front = await gateway(make_server, backend)
    client = GenerateClient(front.url)
    await client.connect()
    try:
        await client.start(prompt="a green field", fps=16, num_frames=60, size="320x240")
        await client.wait_event("video.chunk_metadata")
        change = {"event_id": "e7", "event": {"prompt": "a red field"}, "transition_chunks": 2}
        client.send({"type": "session.interaction", "interaction": change})
        queued = await client.wait_event(where=lambda e: e["type"] in ("session.interaction.queued", "error"))
        done = await client.wait_event("session.done", timeout=30)
        frames = await received_through(client.receiver, 59)
    finally:
        await client.close()

    indices = [f.index for f in frames]
    assert done["stopped"] is False and done["frames"] == 60
    assert indices == list(range(60))
    green = frames[5].mean_rgb
    assert green[1] > green[0] + 60 and green[1] > green[2] + 60
    # The interaction went upstream under the client's event id; the upstream's chunk reports,
    # relayed through the gateway, say where it started and completed.
    assert queued["type"] == "session.interaction.queued" and queued["event_id"] == "e7"
    chunks = {c["generation_chunk_index"]: c for c in client.events if c["type"] == "video.chunk_metadata"}
    start = queued["apply_from_chunk"]
    assert chunks[start]["started_event_ids"] == ["e7"] and chunks[start]["completed_event_ids"] == []
    assert chunks[start + 1]["active_event_ids"] == ["e7"] and chunks[start + 1]["completed_event_ids"] == ["e7"]
    red = frames[-1].mean_rgb
    assert red[0] > red[1] + 60 and red[0] > red[2] + 60


async def test_a_backend_dying_mid_turn_gives_an_error_and_the_next_turn_fails_over(
    make_server: ServerFactory, make_client: ClientFactory
) -> None:
    first_engine, second_engine = CountingEngine(), CountingEngine()
    first_engine.ttft = 2.0
    first = await make_server(engine=first_engine)
    second = await make_server(engine=second_engine)
    front = await gateway(make_server, first, second)
    client = await make_client(front, colour="red", tone=None, config={"modalities": ["text"]})
    await client.wait_event(where=_accepted)

    mark = len(client.events)
    client.send({"type": "video.query", "text": "one"})
    await client.wait_event("response.start", after=mark)
    async with asyncio.timeout(5):
        while first_engine.turns == 0:
            await asyncio.sleep(0.02)
    await first.server.close()
    error = await client.wait_event("error", after=mark)
    done = await client.wait_event("response.text.done", after=mark)

    assert error["message"] == "Query processing failed"
    # The backend either says it is shutting down before it goes, or just drops the connection.
    assert "Server shutting down" in error["detail"] or "closed the connection" in error["detail"]
    assert done["request_id"] == error["request_id"]
    assert "127.0.0.1" not in str(client.events)  # the upstream's address stays in the gateway's log
    result = await client.ask("two")
    assert not result.errors and "mostly red" in result.text
    assert (first_engine.turns, second_engine.turns) == (1, 1)


class BrokenEngine(SyntheticEngine):
    """A model whose every turn fails, with a reason (as a vLLM-Omni stage that died)."""

    async def generate(self, turn: UnderstandTurn) -> AsyncIterator[UnderstandOutput]:
        raise EngineError("The model's engine is down (Stage-1 has no live replica)")
        yield  # pragma: no cover - makes this an async generator


async def test_a_turn_failed_upstream_reaches_the_client_with_the_upstreams_reason(
    make_server: ServerFactory, make_client: ClientFactory
) -> None:
    front = await gateway(make_server, await make_server(engine=BrokenEngine()))
    client = await make_client(front, colour="red", tone=None, config={"modalities": ["text"]})
    await client.wait_event(where=_accepted)
    result = await client.ask("anyone there?")
    error = next(e for e in result.events if e["type"] == "error")
    assert result.errors == ["Query processing failed"]
    assert error["detail"] == (
        "upstream: Query processing failed: The model's engine is down (Stage-1 has no live replica)"
    )


def test_upstreams_are_chosen_by_load_and_health() -> None:
    pool = UpstreamPool(["ws://a", "ws://b", "ws://c", "ws://d"], "/v1/video/chat/stream", 10.0, 1.0)
    a, b, c, d = pool.upstreams
    a.active, b.active, c.active, d.active = 2, 0, 1, 0
    pool.mark_down(b)
    pool.mark_not_serving(d)
    assert [u.url for u in pool.candidates()] == ["ws://c", "ws://a", "ws://b", "ws://d"]


async def test_no_reachable_upstream_fails_the_turn_with_the_reason(
    make_server: ServerFactory, make_client: ClientFactory
) -> None:
    gone = await make_server()
    front = await gateway(make_server, gone)
    await gone.server.close()
    client = await make_client(front, colour="red", tone=None, config={"modalities": ["text"]})
    await client.wait_event(where=_accepted)
    result = await client.ask("anyone there?")
    error = next(e for e in result.events if e["type"] == "error")
    assert result.errors == ["Query processing failed"]
    assert error["detail"] == "no upstream reachable (1 tried)"  # the address stays in the log
    assert "127.0.0.1" not in str(client.events)


async def test_an_upstream_with_a_token_answers_a_gateway_that_presents_it_and_no_other(
    make_server: ServerFactory, make_client: ClientFactory, caplog: pytest.LogCaptureFixture
) -> None:
    backend = await make_server(auth_token="upstream-secret")
    for key, refusal in [(None, "a request without"), ("wrong", "the")]:
        front = await gateway(make_server, backend, upstream_api_key=key)
        client = await make_client(front, colour="red", tone=None, config={"modalities": ["text"]})
        await client.wait_event(where=_accepted)
        refused = await client.ask("anyone there?")
        assert refused.errors == ["Query processing failed"]
        assert f"HTTP 401: it refused {refusal} --upstream-api-key" in caplog.text
    front = await gateway(make_server, backend, upstream_api_key="upstream-secret")
    client = await make_client(front, colour="red", tone=None, config={"modalities": ["text"]})
    await client.wait_event(where=_accepted)
    answered = await client.ask("What colour is the camera showing?")
    assert not answered.errors and "mostly red" in answered.text


async def test_a_server_without_the_endpoint_is_tried_last_from_then_on(
    make_server: ServerFactory, make_client: ClientFactory
) -> None:
    generation_only = await make_server(engine=None)
    generation_only.app[ENGINES].understand = None
    understanding = await make_server()
    front = await gateway(make_server, generation_only, understanding)
    client = await make_client(front, colour="red", tone=None, config={"modalities": ["text"]})
    await client.wait_event(where=_accepted)
    await client.ask("first")  # refused, or already moved to the other server by the refusal
    answered = await client.ask("second")
    assert not answered.errors and "mostly red" in answered.text
    assert not front.app[ENGINES].understand.pool.upstreams[0].serves


@pytest.mark.media
async def test_stopping_a_bridged_generation_stops_the_upstream(make_server: ServerFactory) -> None:
    backend = await make_server(
        synthetic_chunk_frames=5, synthetic_first_chunk_latency=0.1, synthetic_chunk_latency=0.2
    )
    front = await gateway(make_server, backend)
    client = GenerateClient(front.url)
    await client.connect()
    try:
        await client.start(prompt="red", fps=16, num_frames=400, size="320x240")
        async with asyncio.timeout(15):
            while client.receiver is None or len(client.receiver.frames) < 10:
                await asyncio.sleep(0.02)
        client.send({"type": "session.stop"})
        done = await client.wait_event("session.done", timeout=15)
    finally:
        await client.close()

    assert done["stopped"] is True and 10 <= done["frames"] < 400
    async with asyncio.timeout(5):
        while backend.video_engine._running or len(backend.registry):
            await asyncio.sleep(0.05)


def _wav_b64(samples: int) -> str:
    out = io.BytesIO()
    with wave.open(out, "wb") as wav:
        wav.setnchannels(1)
        wav.setsampwidth(2)
        wav.setframerate(24_000)
        wav.writeframes(b"\x00\x10" * samples)
    return base64.b64encode(out.getvalue()).decode("ascii")


SCRIPTS = {
    # async chunking: text.done at the first audio output, deltas after it, newer audio event names
    "streaming": [
        {"type": "response.start"},
        {"type": "response.text.delta", "delta": "It is "},
        {"type": "response.text.done", "text": "It is "},
        {"type": "response.output_audio.delta", "data": _wav_b64(2400), "format": "wav"},
        {"type": "response.text.delta", "delta": "red."},
        {"type": "response.audio.delta", "data": _wav_b64(4800), "format": "wav"},
        {"type": "response.audio.done"},
    ],
    # VLLM_VIDEO_ASYNC_CHUNK=off: no deltas, the whole text in text.done
    "coalesced": [
        {"type": "response.start"},
        {"type": "response.text.done", "text": "It is red."},
        {"type": "response.audio.delta", "data": _wav_b64(7200), "format": "wav"},
        {"type": "response.audio.done"},
    ],
}


async def test_the_reference_done_event_quirks_give_the_whole_answer_once() -> None:
    received: list[dict] = []

    async def upstream(request: web.Request) -> web.WebSocketResponse:
        ws = web.WebSocketResponse()
        await ws.prepare(request)
        async for message in ws:
            event = json.loads(message.data)
            received.append(event)
            if event["type"] == "video.query":
                for reply in SCRIPTS[event["text"]]:
                    await ws.send_json(reply)
        return ws

    app = web.Application()
    app.router.add_get("/v1/video/chat/stream", upstream)
    server = TestServer(app, host="127.0.0.1", port=0)
    await server.start_server()
    url = str(server.make_url("")).rstrip("/").replace("http://", "ws://")
    engine = RemoteUnderstandEngine(UpstreamPool([url], "/v1/video/chat/stream", 10.0, 2.0))
    frame = TurnFrame(frame_id=None, pts_ms=None, jpeg=simplejpeg.encode_jpeg(np.full((48, 64, 3), 200, np.uint8)))
    try:
        for name in SCRIPTS:
            turn = UnderstandTurn(request_id=name, frames=[frame], audio_pcm16=b"\x00\x00" * 16_000, query=name)
            outputs = [output async for output in engine.generate(turn)]
            text = "".join(o.text for o in outputs if isinstance(o, TextDelta))
            samples = sum(o.samples.size for o in outputs if isinstance(o, AudioChunk))
            assert (text, samples) == ("It is red.", 7200), name
    finally:
        await engine.close()
        await server.close()

    config = received[0]
    assert config["type"] == "session.config" and config["num_frames"] == 1
    assert config["enable_frame_filter"] is False
    assert [e["type"] for e in received[1:3]] == ["video.frame", "video.query"]
    assert base64.b64decode(received[2]["audio_data"]) == b"\x00\x00" * 16_000


async def test_health_checks_skip_a_dead_upstream_and_restore_a_live_one(make_server: ServerFactory) -> None:
    from rtc_omni.engines.upstream import UpstreamPool

    live = await make_server()
    with socket.socket() as sock:  # a port nobody listens on
        sock.bind(("127.0.0.1", 0))
        dead_url = f"ws://127.0.0.1:{sock.getsockname()[1]}"
    pool = UpstreamPool(
        [dead_url, ws_url(live)], "/v1/video/chat/stream", retry_s=60, connect_timeout_s=2, health_interval_s=0
    )
    try:
        await pool.check_health()
        assert [u.url for u in pool.candidates()][0] == ws_url(live)
        assert not pool.upstreams[0].healthy and pool.upstreams[1].healthy
        pool.mark_down(pool.upstreams[1])  # e.g. a dropped connection earlier
        await pool.check_health()
        assert pool.upstreams[1].healthy  # back without waiting out retry_s
    finally:
        await pool.close()
