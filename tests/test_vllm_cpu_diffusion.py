"""Wan and Helios on real vLLM-Omni 0.30 on CPU: generations to a real aiortc peer and over the
WebSocket endpoint, Helios streamed with an interaction (tests/vllm_cpu/serving.py). One server at a
time: each class's server stops before the next starts."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Iterator

import pytest

from rtc_omni.client.rtc_peers import GenerateClient

from .vllm_cpu.serving import (
    MARKS,
    TURN_TIMEOUT_S,
    Served,
    serve,
    timed,
    tiny_model,
    vllm_python,
    websocket_generates,
)

pytestmark = MARKS


@pytest.fixture(scope="class")
def wan() -> Iterator[Served]:
    yield from serve(vllm_python(), tiny_model("wan"))


@pytest.fixture(scope="class")
def helios() -> Iterator[Served]:
    yield from serve(vllm_python(), tiny_model("helios"), "--engine-arg", "diffusion-streaming-output")


class TestWan:
    async def test_generates_one_video_to_the_peer(self, wan: Served) -> None:
        client = GenerateClient(wan.url)
        await client.connect()
        try:
            sent_at = time.monotonic()
            await client.start(prompt="a red cat", size="128x128", fps=16, num_frames=17, num_inference_steps=2)
            done = await client.wait_event("session.done", timeout=TURN_TIMEOUT_S)
            await asyncio.sleep(0.5)  # the last frames are paced out at 16 fps
            frames = list(client.receiver.frames) if client.receiver is not None else []
        finally:
            await client.close()
        assert done["frames"] == 17 and not done["stopped"], (done, wan.tail())
        assert len(frames) == 17 and {(f.width, f.height) for f in frames} == {(128, 128)}
        print(f"\n[vllm-cpu] Wan: 17 frames in {time.monotonic() - sent_at:.2f} s")

    async def test_the_same_model_over_the_websocket_endpoint(self, wan: Served) -> None:
        await websocket_generates(wan, {"prompt": "a red cat", "num_frames": 17, "num_inference_steps": 2}, 1, 17)


class TestHeliosStreaming:
    """Helios served with `--engine-arg diffusion-streaming-output`: one 33-frame chunk at a time."""

    CHUNKS = 5
    FRAMES_PER_CHUNK = 33  # Helios's 9 latent frames a chunk

    async def test_streams_chunks_and_an_interaction_starts_where_announced(self, helios: Served) -> None:
        client = GenerateClient(helios.url)
        await client.connect()
        frames_total = self.CHUNKS * self.FRAMES_PER_CHUNK
        change = {"event_id": "evt-blue", "event": {"prompt": "a blue sky"}, "transition_chunks": 2}
        try:
            sent_at = time.monotonic()
            await client.start(
                prompt="a red cat", size="128x128", fps=16, num_frames=frames_total, num_inference_steps=2
            )
            await client.wait_event("video.chunk_metadata", timeout=TURN_TIMEOUT_S)
            timed("Helios first chunk", sent_at)
            # Sent as chunk 0 arrives: vLLM-Omni is then computing chunk 1 (several seconds on CPU).
            mark = len(client.events)
            client.send({"type": "session.interaction", "interaction": change})
            queued = await client.wait_event("session.interaction.queued", after=mark, timeout=30)
            done = await client.wait_event("session.done", timeout=TURN_TIMEOUT_S * 2)
            timed(f"Helios {done['chunks']} chunks", sent_at)
            await asyncio.sleep(1.0)  # the last frames are paced out at 16 fps
            frames = list(client.receiver.frames) if client.receiver is not None else []
        finally:
            await client.close()
        assert not [e for e in client.events if e["type"] == "error"], (client.events, helios.tail())
        reports = [e for e in client.events if e["type"] == "video.chunk_metadata"]
        # One report a chunk, numbered by vLLM-Omni, covering the frames in order.
        assert [r["generation_chunk_index"] for r in reports] == list(range(self.CHUNKS)), (reports, helios.tail())
        assert [r["num_frames"] for r in reports] == [self.FRAMES_PER_CHUNK] * self.CHUNKS
        assert [(r["first_frame_index"], r["last_frame_index"]) for r in reports] == [
            (i * self.FRAMES_PER_CHUNK, (i + 1) * self.FRAMES_PER_CHUNK - 1) for i in range(self.CHUNKS)
        ]
        assert done["chunks"] == self.CHUNKS and done["frames"] == frames_total and not done["stopped"]
        assert len(frames) == frames_total and {(f.width, f.height) for f in frames} == {(128, 128)}
        # The interaction starts in the chunk we announced, is active for its transition and completes.
        # The announcement counts from the chunks delivered when it was queued; vLLM-Omni counts from
        # the chunk it is computing. They agree on a machine that keeps up (4 of 4 runs alone); with
        # the suite's other vLLM servers starving this one, vLLM-Omni once started it a chunk earlier.
        announced = queued["apply_from_chunk"]
        assert queued["event_id"] == "evt-blue"
        started = [r["generation_chunk_index"] for r in reports if "evt-blue" in r["started_event_ids"]]
        active = [r["generation_chunk_index"] for r in reports if "evt-blue" in r["active_event_ids"]]
        completed = [r["generation_chunk_index"] for r in reports if "evt-blue" in r["completed_event_ids"]]
        print(f"\n[vllm-cpu] interaction queued for chunk {announced}; vLLM-Omni: started {started}, active {active}")
        assert len(started) == 1 and started[0] in (announced - 1, announced), (queued, reports)
        start = started[0]
        assert active == [start, start + 1] and completed == [start + 1], (queued, reports)
        # Those lists are vLLM-Omni's own: the server logs each report that names an interaction as
        # it came from the engine (without one, the session would derive the lists from its schedule).
        # Started a chunk early, the interaction is over before the last chunk, which names none.
        marker = "vLLM-Omni chunk report for "
        logged = [
            json.loads(line.split(marker, 1)[1].split(": ", 1)[1])
            for line in helios.log.read_text(errors="replace").splitlines()
            if marker in line
        ]
        naming = [r for r in reports if r["generation_chunk_index"] in range(start, start + 2)]
        assert [(r["generation_chunk_index"], r["started_event_ids"], r["active_event_ids"]) for r in logged] == [
            (r["generation_chunk_index"], r["started_event_ids"], r["active_event_ids"]) for r in naming
        ], (logged, reports)

    async def test_the_same_model_over_the_websocket_endpoint(self, helios: Served) -> None:
        request = {"prompt": "a red cat", "num_frames": 2 * self.FRAMES_PER_CHUNK, "num_inference_steps": 2}
        await websocket_generates(helios, request, 2, 2 * self.FRAMES_PER_CHUNK)
