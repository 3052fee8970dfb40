"""Generation sessions end to end: a prompt in, block-coded frames decoded at a real aiortc peer."""

from __future__ import annotations

import asyncio
import io
import time
from collections.abc import AsyncIterator

import aiohttp
import av
import numpy as np
import pytest

from rtc_omni.client.rtc_peers import GenerateClient
from rtc_omni.engines import GenerateRequest, SyntheticVideoEngine, VideoChunk
from rtc_omni.media import blockcode

from .conftest import RunningServer, ServerFactory, http_json
from .generate_client import SMALL, connect, received_through

pytestmark = pytest.mark.media


@pytest.fixture
async def gen_server(make_server: ServerFactory) -> RunningServer:
    return await make_server(synthetic_chunk_frames=33, synthetic_first_chunk_latency=0.3, synthetic_chunk_latency=0.3)


async def settle(client: GenerateClient, seconds: float = 0.4) -> list:
    await asyncio.sleep(seconds)
    return list(client.receiver.frames)


@pytest.mark.parametrize("codec", ["vp8", "h264"])
async def test_frames_arrive_complete_in_order_at_the_requested_rate(gen_server: RunningServer, codec: str) -> None:
    client = await connect(gen_server, video_codec=codec)
    try:
        start = await client.start(prompt="a green field", fps=16, num_frames=66, **SMALL)
        done = await client.wait_event("session.done", timeout=30)
        frames = await received_through(client.receiver, 65)
    finally:
        await client.close()

    assert start["config"]["prompt"] == "a green field"
    assert [f.index for f in frames] == list(range(66))  # in order, none missing
    assert done["request_id"] == start["request_id"]
    assert (done["chunks"], done["frames"], done["stopped"]) == (2, 66, False)
    gaps = [b.at - a.at for a, b in zip(frames, frames[1:])]
    # The pace is the requested rate, read as the median frame interval over spans of four frames,
    # and the frames came no faster than it on the whole (the mean gap). A loaded machine shows in
    # the single gaps: a hold of this process (server and peer) under MAX_CATCH_UP_S is caught up,
    # a long gap then short ones; over it the track re-bases rather than bursting
    # (media/video_out.py), one long gap (with the loop blocked 0.6 s mid-stream the mean gap reads
    # 0.070 s); and the peer's receiver released frames in a long-short rhythm in one suite run
    # (0.056, 0.072, 0.054, 0.067 s ..., median gap 0.056 s). A span of four averages the rhythm
    # out, and a hold touches at most four of the spans.
    spans = [(b.at - a.at) / 4 for a, b in zip(frames, frames[4:])]
    assert abs(np.median(spans) - 1 / 16) < 0.1 / 16, gaps
    assert np.mean(gaps) > 0.9 / 16, gaps
    assert {(f.width, f.height) for f in frames} == {(320, 240)}
    green = frames[len(frames) // 2].mean_rgb
    assert green[1] > green[0] + 60 and green[1] > green[2] + 60


async def test_stop_midway_ends_with_stopped_and_no_more_frames(gen_server: RunningServer) -> None:
    client = await connect(gen_server)
    try:
        await client.start(prompt="red", fps=30, num_frames=300, **SMALL)
        async with asyncio.timeout(10):
            while client.receiver is None or len(client.receiver.frames) < 20:
                await asyncio.sleep(0.02)
        client.send({"type": "session.stop"})
        done = await client.wait_event("session.done")
        await received_through(client.receiver, done["frames"] - 1)
        frames = await settle(client, 0.6)  # anything sent after the stop would arrive meanwhile
    finally:
        await client.close()

    assert done["stopped"] is True and 20 <= done["frames"] < 300
    # Exactly the frames the server says it sent: the last may land after session.done (media and
    # the DataChannel are separate paths), but none comes after them.
    assert [f.index for f in frames] == list(range(done["frames"]))
    assert gen_server.video_engine._running == {}  # the engine request was aborted


async def test_interaction_changes_the_colour_from_the_stated_chunk(make_server: ServerFactory) -> None:
    server = await make_server(
        synthetic_chunk_frames=10, synthetic_first_chunk_latency=0.1, synthetic_chunk_latency=0.25
    )
    client = await connect(server)
    try:
        await client.start(prompt="a red balloon", fps=30, num_frames=60, **SMALL)
        await client.wait_event("video.chunk_metadata")
        sharp = {"event_id": "e1", "event": {"prompt": "a blue sky"}, "transition_chunks": 0}
        client.send({"type": "session.interaction", "interaction": sharp})
        queued = await client.wait_event(where=lambda e: e["type"] in ("session.interaction.queued", "error"))
        assert queued["type"] == "session.interaction.queued" and queued["event_id"] == "e1"
        mark = len(client.events)
        client.send({"type": "session.interaction", "interaction": {"event_id": "e1", "event": {"prompt": "green"}}})
        conflict = await client.wait_event("error", after=mark)
        assert conflict["code"] == "event_id_conflict" and conflict["event_id"] == "e1"
        await client.wait_event("session.done", timeout=30)
        frames = await settle(client)
    finally:
        await client.close()

    chunks = [e for e in client.events if e["type"] == "video.chunk_metadata"]
    started = [c for c in chunks if "e1" in c["started_event_ids"]]
    assert len(started) == 1 and started[0]["generation_chunk_index"] == queued["apply_from_chunk"]
    assert started[0]["completed_event_ids"] == ["e1"]
    boundary = started[0]["first_frame_index"]
    assert 0 < boundary < 60
    for frame in frames:
        r, _, b = frame.mean_rgb
        assert (b > r + 80) if frame.index >= boundary else (r > b + 80), (frame.index, frame.mean_rgb)


class HangingVideoEngine(SyntheticVideoEngine):
    """Yields one chunk, then makes no progress for a long time."""

    def __init__(self, hang_s: float) -> None:
        super().__init__(chunk_frames=5, first_chunk_latency=0.05, chunk_latency=hang_s)
        self.aborted: list[str] = []

    async def abort(self, request_id: str) -> None:
        self.aborted.append(request_id)
        await super().abort(request_id)


async def test_a_hung_engine_trips_the_stall_timeout(make_server: ServerFactory) -> None:
    engine = HangingVideoEngine(hang_s=3600)
    server = await make_server(video_engine=engine, engine_stall_timeout=1.0)
    client = await connect(server)
    try:
        start = await client.start(prompt="x", fps=30, num_frames=50, **SMALL)
        error = await client.wait_event("error", timeout=10)
        done = await client.wait_event("session.done")
    finally:
        await client.close()
    assert error["message"] == "Stall timeout: no generation progress"
    assert done["stopped"] is True and done["frames"] == 5
    assert engine.aborted == [start["request_id"]]


async def test_pings_keep_a_slow_engine_alive(make_server: ServerFactory) -> None:
    server = await make_server(video_engine=HangingVideoEngine(hang_s=1.5), engine_stall_timeout=1.0)
    client = await connect(server)
    try:
        await client.start(prompt="x", fps=30, num_frames=10, **SMALL)
        pongs = 0
        while not any(e["type"] == "session.done" for e in client.events):
            mark = len(client.events)
            client.send({"type": "session.ping"})
            await client.wait_event("session.pong", after=mark)
            pongs += 1
            await asyncio.sleep(0.3)
    finally:
        await client.close()
    done = next(e for e in client.events if e["type"] == "session.done")
    assert pongs >= 3 and done["stopped"] is False and done["frames"] == 10
    assert not [e for e in client.events if e["type"] == "error"]


async def test_a_slow_engine_makes_the_track_wait_without_a_burst(make_server: ServerFactory) -> None:
    # Each chunk plays for 1/3 s and the next comes 1.5 s after it: a stall of ~1.2 s at the peer,
    # which a loop hiccup of up to ~0.7 s in this process (server and peer share it) cannot hide
    # below the 0.5 s threshold. (With 1.0 s, a 0.3 s hiccup left 0.51 s.)
    server = await make_server(
        synthetic_chunk_frames=10, synthetic_first_chunk_latency=0.05, synthetic_chunk_latency=1.5
    )
    client = await connect(server)
    try:
        await client.start(prompt="x", fps=30, num_frames=30, **SMALL)
        await client.wait_event("session.done", timeout=20)
        frames = await received_through(client.receiver, 29)
    finally:
        await client.close()
    assert [f.index for f in frames] == list(range(30))
    gaps = np.diff([f.at for f in frames])
    stalls = [i for i, g in enumerate(gaps) if g > 0.5]
    assert len(stalls) == 2  # between the three chunks
    for i in stalls:  # after each stall the pace resumes at 1/fps: no catch-up burst
        # (judged over five frames: on a loaded machine one frame may reach the peer close behind another)
        assert sum(gaps[i + 1 : i + 6]) > 5 * 0.5 / 30, gaps[i + 1 : i + 6]


class BurstVideoEngine(SyntheticVideoEngine):
    """Produces chunks instantly, far faster than real time."""

    def __init__(self) -> None:
        super().__init__(chunk_frames=20, first_chunk_latency=0.0, chunk_latency=0.0)
        self.produced_at: list[float] = []

    async def generate(self, request: GenerateRequest) -> AsyncIterator[VideoChunk]:
        async for chunk in super().generate(request):
            self.produced_at.append(time.monotonic())
            yield chunk


async def test_the_backlog_is_bounded_and_back_pressures_the_engine(make_server: ServerFactory) -> None:
    engine = BurstVideoEngine()
    server = await make_server(video_engine=engine)
    client = await connect(server)
    path = f"/v1/rtc/sessions/{client.session_id}"
    try:
        await client.start(prompt="x", fps=30, num_frames=200, **SMALL)
        samples = []
        while not any(e["type"] == "session.done" for e in client.events):
            samples.append((await http_json(server, "GET", path, headers=client.session_headers))[1])
            await asyncio.sleep(0.2)
    finally:
        await client.close()
    assert max(s["video_backlog_frames"] for s in samples) <= 48
    assert all(s["frames_generated"] - s["frames_sent"] <= 48 + 20 for s in samples)
    # The engine was held back to the pace of the track: 10 chunks spread over ~200/30 s.
    assert engine.produced_at[-1] - engine.produced_at[0] > 4.0


async def test_recording_holds_exactly_the_frames_sent(gen_server: RunningServer) -> None:
    client = await connect(gen_server)
    try:
        await client.start(prompt="purple", fps=16, num_frames=40, record=True, **SMALL)
        recording = f"/v1/rtc/sessions/{client.session_id}/recording"
        status, _ = await http_json(gen_server, "GET", recording, headers=client.session_headers)
        assert status == 409  # not finished yet
        done = await client.wait_event("session.done", timeout=30)
        await asyncio.sleep(0.5)
        async with aiohttp.ClientSession() as http:
            async with http.get(gen_server.url + done["recording"]) as response:  # its URL carries a view token
                assert response.status == 200 and response.content_type == "video/mp4"
                data = await response.read()
    finally:
        await client.close()
    with av.open(io.BytesIO(data)) as container:
        decoded = [f.to_ndarray(format="rgb24") for f in container.decode(video=0)]
    assert len(decoded) == done["frames"] == 40
    assert decoded[0].shape == (240, 320, 3)
    assert [blockcode.read(f) for f in decoded] == list(range(40))
    unknown = f"/v1/rtc/sessions/{client.session_id}x/recording"
    assert (await http_json(gen_server, "GET", unknown, headers=client.session_headers))[0] == 401
