"""The bridge against vLLM-Omni 0.30's genuine WebSocket handlers: an aiortc peer -> a gateway
(`--engine remote`, in this process) -> vLLM-Omni's own `/v1/video/chat/stream` and
`/v1/realtime/video` route functions and handler classes, served by tests/vllm_cpu/genuine_server.py
in the vLLM-Omni environment with fake engines (no model). Each test checks one fault the bridge
had against them, by what the peer sees and what the upstream engine was asked.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

import pytest

from rtc_omni.client.rtc_peers import GenerateClient
from rtc_omni.signaling.keys import ENGINES

from .conftest import ClientFactory, RunningServer, ServerFactory
from .genuine import Genuine, Vanishing, gateway_to
from .realtime_client import connect
from .test_realtime_calls import Call, stats_until
from .test_realtime_calls import call as call  # the fixture

pytestmark = pytest.mark.slow  # vLLM-Omni servers in subprocesses

QWEN = "qwen-omni-tiny"
WAN = "wan-tiny"
SETTINGS_SENT = {
    "model": QWEN,
    "system_prompt": "Be brief.",
    "sampling_params_list": [{"temperature": 0.3, "max_tokens": 50}],
    "use_audio_in_video": False,
}


@pytest.fixture(scope="module")
def genuine() -> Iterator[Genuine]:
    """One server for the module: both endpoints, and the non-streaming generation under /whole."""
    server = Genuine("--kind", "both", "--model", WAN)
    yield server
    server.stop()


@pytest.fixture
def understanding(genuine: Genuine) -> Genuine:
    return genuine


@pytest.fixture
def generation(genuine: Genuine) -> Genuine:
    return genuine


@pytest.fixture
def generation_without_streaming(genuine: Genuine) -> Genuine:
    return genuine.under("/whole")


GatewayFactory = Callable[..., Awaitable[RunningServer]]


@pytest.fixture
def gateway(make_server: ServerFactory) -> GatewayFactory:
    async def factory(*upstreams: str) -> RunningServer:
        return await gateway_to(make_server, *upstreams)

    return factory


def _requests(record: dict[str, list[Any]], query: str) -> list[dict[str, Any]]:
    return [r for r in record["requests"] if r.get("query") == query]


async def test_answers_keep_the_conversation_and_the_session_settings_on_one_upstream_session(
    understanding: Genuine, gateway: GatewayFactory, make_client: ClientFactory
) -> None:
    front = await gateway(understanding.url)
    client = await make_client(front, colour="red", tone=440.0, config=SETTINGS_SENT)
    await client.wait_event("video.frame.ack")
    await asyncio.sleep(1.0)  # some microphone audio for the first turn

    first = await client.ask("what is this?")
    await asyncio.sleep(1.0)  # ... and for the second, which reaches the upstream as it is sampled
    second = await client.ask("and now?")

    # Answers as vLLM-Omni's handler sends them, heard at the peer.
    assert not first.errors and "you asked: what is this?" in first.text and "audio yes" in first.text
    assert client.recorder is not None and client.recorder.voiced_frames(first.sent_at, first.done_at) > 10
    assert not second.errors and "you asked: and now?" in second.text and "audio yes" in second.text
    record = await understanding.record()
    (asked_first,) = _requests(record, "what is this?")
    (asked_second,) = _requests(record, "and now?")
    # One upstream session: the second prompt replays the first exchange from its history.
    assert asked_second["history"] == ["what is this?", first.text]
    # session.config reached the upstream engine: the per-stage sampling params, no audio in the
    # video (the mic audio is there, yet no use_audio_in_video), the system prompt, the model name.
    assert asked_first["sampling_params_list"] == [{"temperature": 0.3, "max_tokens": 50}]
    assert asked_first["audio"] is True and asked_first["mm_processor_kwargs"] is None
    assert asked_first["system"] == ["Be brief."] and asked_first["model"] == QWEN
    assert asked_first["images"] >= 1


async def test_an_interrupt_aborts_the_upstream_request_before_its_next_output(
    understanding: Genuine, gateway: GatewayFactory, make_client: ClientFactory
) -> None:
    front = await gateway(understanding.url)
    client = await make_client(front, colour="blue", tone=None, config={"modalities": ["text"]})
    await client.wait_event("video.frame.ack")
    mark = len(client.events)
    client.send({"type": "video.query", "text": "tell a slow story"})
    started = await client.wait_event("response.start", after=mark)
    await client.wait_event("response.text.delta", after=mark)  # the upstream is generating
    record = await understanding.wait_record(lambda r: bool(_requests(r, "tell a slow story")))
    (request,) = _requests(record, "tell a slow story")

    client.send({"type": "response.cancel"})
    cancelled = await client.wait_event("response.cancelled", after=mark)
    # The fake engine pauses 30 s after its first word: the abort must not wait for its next output.
    await understanding.wait_record(lambda r: request["request_id"] in r["aborts"], timeout=10.0)

    assert cancelled["request_id"] == started["request_id"]
    after = await client.ask("still there?")
    assert not after.errors and "you asked: still there?" in after.text


async def test_a_failed_upstream_is_replaced_and_the_client_hears_that_context_was_lost(
    understanding: Genuine, gateway: GatewayFactory, make_client: ClientFactory
) -> None:
    doomed = Vanishing(understanding)  # the first upstream: the same server, through a forwarder that vanishes
    try:
        front = await gateway(await doomed.start(), understanding.url)
        client = await make_client(front, colour="green", tone=None, config={"modalities": ["text"]})
        await client.wait_event("video.frame.ack")
        first = await client.ask("who answers first?")
        assert _requests(await understanding.record(), "who answers first?")
    finally:
        await doomed.vanish()

    second = await client.ask("who answers now?")

    lost = [e for e in second.events if e["type"] == "session.context_lost"]
    assert not first.errors and not second.errors and "you asked: who answers now?" in second.text
    assert len(lost) == 1 and lost[0]["request_id"] == second.request_id
    assert "127.0.0.1" not in str(client.events)  # no upstream address reaches the client
    (asked,) = _requests(await understanding.record(), "who answers now?")
    assert asked["history"] == [] and asked["images"] >= 1  # the new upstream got the frames, not the past


async def test_a_generation_takes_the_upstreams_model_name_and_an_interaction_sent_at_once(
    generation: Genuine, gateway: GatewayFactory
) -> None:
    front = await gateway(generation.url)
    client = GenerateClient(front.url)
    await client.connect()
    try:
        await client.start(prompt="a green field", model=WAN, fps=16, num_frames=32, size="160x128")
        change = {"event_id": "e1", "event": {"prompt": "a red field"}, "transition_chunks": 0}
        client.send({"type": "session.interaction", "interaction": change})
        queued = await client.wait_event(where=lambda e: e["type"] in ("session.interaction.queued", "error"))
        done = await client.wait_event("session.done", timeout=30)
    finally:
        await client.close()

    assert queued["type"] == "session.interaction.queued" and queued["event_id"] == "e1"
    assert done["stopped"] is False and done["frames"] == 32
    interactions = (await generation.record())["interactions"]
    assert {"event_id": "e1", "prompt": "a red field"} in [
        {k: i[k] for k in ("event_id", "prompt")} for i in interactions
    ]


async def test_a_generation_without_streaming_output_arrives_whole(
    generation_without_streaming: Genuine, gateway: GatewayFactory
) -> None:
    front = await gateway(generation_without_streaming.url)
    client = GenerateClient(front.url)
    await client.connect()
    try:
        await client.start(prompt="a blue field", model=WAN, fps=16, num_frames=24, size="160x128")
        done = await client.wait_event(where=lambda e: e["type"] in ("session.done", "error"), timeout=30)
        await asyncio.sleep(0.3)
        frames = list(client.receiver.frames) if client.receiver is not None else []
    finally:
        await client.close()

    assert done["type"] == "session.done" and done["stopped"] is False and done["frames"] == 24
    chunks = [e for e in client.events if e["type"] == "video.chunk_metadata"]
    assert chunks and {c["generation_chunk_index"] for c in chunks} == {0}
    blue = frames[-1].mean_rgb
    assert blue[2] > blue[0] + 60 and blue[2] > blue[1] + 60


async def test_a_realtime_call_to_an_upstream_without_duplex_sessions_takes_the_older_endpoint(
    understanding: Genuine, make_server: ServerFactory, call: Call
) -> None:
    """vLLM-Omni without a duplex deployment refuses `/v1/realtime?duplex=1`: the gateway marks it and
    answers a call with a camera on `/v1/video/chat/stream`, and a voice-only one with the reason."""
    front = await gateway_to(make_server, understanding.url)  # --upstream-protocol auto
    await call.connect(front, {"type": "realtime"})
    await stats_until(front, call, lambda s: s["camera_frames"] >= 1)
    mark = len(call.events)
    call.send({"type": "response.create"})
    done = await call.wait("response.done", after=mark)
    assert done["response"]["status"] == "completed"
    assert "frames" in done["response"]["output"][0]["content"][0]["transcript"]  # the older endpoint's answer
    realtime_pool = front.app[ENGINES].understand.realtime_pool
    assert realtime_pool is not None and not realtime_pool.upstreams[0].serves

    async with connect(front) as rt:  # the SDK over WebSocket: no camera
        await rt.send({"type": "response.create"})
        failed = (await rt.until("response.done"))[-1]["response"]
    assert failed["status"] == "failed"
    assert "answers only with a camera frame" in failed["status_details"]["error"]["message"]
