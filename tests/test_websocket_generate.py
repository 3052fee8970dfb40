"""`WS /v1/realtime/video` with a plain WebSocket client: fMP4 chunks that PyAV demuxes, and every error."""

from __future__ import annotations

import io
import json

import av
import pytest

from rtc_omni.media import blockcode

from .conftest import RunningServer, ServerFactory, WsFactory

PATH = "/v1/realtime/video"
SMALL = {"size": "320x240"}


@pytest.fixture
async def gen_server(make_server: ServerFactory) -> RunningServer:
    return await make_server(synthetic_chunk_frames=10, synthetic_first_chunk_latency=0.1, synthetic_chunk_latency=0.1)


def demux(data: bytes) -> list[int]:
    """The block-coded index of every frame in an fMP4 stream."""
    with av.open(io.BytesIO(data), mode="r", format="mp4") as container:
        return [blockcode.read(frame.to_ndarray(format="rgb24")) for frame in container.decode(video=0)]


async def test_generation_streams_fmp4_chunks_each_announced_by_metadata(
    gen_server: RunningServer, make_ws: WsFactory
) -> None:
    client = await make_ws(gen_server, PATH)
    await client.send({"type": "session.start", "prompt": "a red kite", "fps": 16, "num_frames": 25, **SMALL})
    await client.wait_closed(timeout=30)

    log = client.log
    start, done = log[0], log[-1]
    assert isinstance(start, dict) and start["type"] == "video.start" and start["format"] == "m4s"
    assert start["request_id"].startswith("video_stream-") and start["config"]["prompt"] == "a red kite"
    assert isinstance(done, dict) and done["type"] == "session.done" and done["stopped"] is False
    body = log[1:-1]
    # Every binary message follows the metadata event that describes it.
    pairs = list(zip(body[::2], body[1::2]))
    assert len(body) == 2 * len(pairs)
    assert all(isinstance(meta, dict) and isinstance(data, bytes) for meta, data in pairs)
    assert [meta["byte_length"] for meta, data in pairs] == [len(data) for _, data in pairs]
    assert [meta["transport_chunk_index"] for meta, _ in pairs] == list(range(len(pairs)))
    assert [meta["kind"] for meta, _ in pairs] == ["media"] * 3 + ["trailer"]
    assert [meta["num_frames"] for meta, _ in pairs] == [10, 10, 5, 0]
    assert [meta["generation_chunk_index"] for meta, _ in pairs] == [0, 1, 2, 2]
    assert done["chunks"] == len(pairs) and done["request_id"] == start["request_id"]
    # The first message carries the init segment; the whole stream demuxes into every frame, in order.
    assert pairs[0][1][4:8] == b"ftyp"
    assert demux(b"".join(data for _, data in pairs)) == list(range(25))


async def test_stop_ends_with_stopped_and_no_trailer(gen_server: RunningServer, make_ws: WsFactory) -> None:
    client = await make_ws(gen_server, PATH)
    await client.send({"type": "session.start", "prompt": "blue", "fps": 16, "num_frames": 400, **SMALL})
    await client.wait_event("video.chunk_metadata")
    await client.send({"type": "session.ping"})
    await client.wait_event("session.pong")
    await client.send({"type": "session.stop"})
    await client.wait_closed(timeout=20)

    done = client.events[-1]
    assert done["type"] == "session.done" and done["stopped"] is True
    metadata = [e for e in client.events if e["type"] == "video.chunk_metadata"]
    assert all(m["kind"] == "media" for m in metadata) and done["chunks"] == len(client.binaries)
    assert 0 < len(demux(b"".join(client.binaries))) < 400
    assert gen_server.video_engine._running == {}


async def test_interaction_is_queued_and_reported_in_the_metadata(
    make_server: ServerFactory, make_ws: WsFactory
) -> None:
    server = await make_server(synthetic_chunk_frames=5, synthetic_first_chunk_latency=0.1, synthetic_chunk_latency=0.2)
    client = await make_ws(server, PATH)
    await client.send({"type": "session.start", "prompt": "red", "fps": 16, "num_frames": 30, **SMALL})
    await client.wait_event("video.chunk_metadata")
    interaction = {"event_id": "e1", "event": {"prompt": "blue"}}
    await client.send({"type": "session.interaction", "interaction": interaction})
    queued = await client.wait_event("session.interaction.queued")
    await client.send({"type": "session.interaction", "interaction": interaction})
    conflict = await client.wait_event("error")
    await client.wait_closed(timeout=20)

    assert conflict["code"] == "event_id_conflict"
    started = [e for e in client.events if e["type"] == "video.chunk_metadata" and "e1" in e["started_event_ids"]]
    assert [e["generation_chunk_index"] for e in started] == [queued["apply_from_chunk"]]


@pytest.mark.parametrize(
    ("first", "message"),
    [
        ("not json", "Invalid JSON in session.start"),
        ("[1]", "session.start must be a JSON object"),
        ('{"type": "session.stop"}', "Expected session.start, got: session.stop"),
        ('{"type": "session.start", "prompt": "x", "format": "mp4"}', "Invalid session.start format: expected 'm4s'."),
        ('{"type": "session.start"}', "Invalid session.start: "),
        ('{"type": "session.start", "prompt": "x", "model": "other"}', "Model mismatch: request specifies 'other'"),
        (json.dumps({"type": "session.start", "prompt": "x" * (4 * 1024 * 1024)}), "session.start message too large"),
    ],
)
async def test_a_bad_start_ends_the_session(
    gen_server: RunningServer, make_ws: WsFactory, first: str, message: str
) -> None:
    client = await make_ws(gen_server, PATH)
    await client.send(first)
    await client.wait_closed()
    assert [e["type"] for e in client.events] == ["error"]
    assert client.events[0]["message"].startswith(message)


async def test_no_start_in_time_ends_the_session(make_server: ServerFactory, make_ws: WsFactory) -> None:
    server = await make_server(config_timeout=0.3)
    client = await make_ws(server, PATH)
    await client.wait_closed()
    assert [e["message"] for e in client.events] == ["Timeout waiting for session.start"]


async def test_control_errors_leave_the_generation_running(gen_server: RunningServer, make_ws: WsFactory) -> None:
    client = await make_ws(gen_server, PATH)
    await client.send({"type": "session.start", "prompt": "green", "fps": 16, "num_frames": 40, **SMALL})
    await client.wait_event("video.start")
    await client.send("not json")
    await client.send("[]")
    await client.send({"type": "nope"})
    await client.send({"type": "session.ping", "pad": "x" * (128 * 1024)})
    await client.wait_closed(timeout=30)

    errors = [e["message"] for e in client.events if e["type"] == "error"]
    assert errors == [
        "Invalid JSON message",
        "WebSocket messages must be JSON objects",
        "Unknown message type: nope",
        "control message too large",
    ]
    assert client.events[-1]["type"] == "session.done" and client.events[-1]["stopped"] is False
    assert demux(b"".join(client.binaries)) == list(range(40))
