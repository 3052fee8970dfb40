"""One generation stream at a time: throughput, pacing, and engine frame -> decoded at the peer."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from ..client.rtc_peers import GenerateClient
from .common import CpuMeter, percentile, server

WIDTH, HEIGHT, FPS = 832, 480, 16
# An engine faster than real time: the track's pacing sets the rate.
FAST_ENGINE = ["--synthetic-chunk-frames", "33", "--synthetic-first-chunk-latency", "1.0"]
FAST_ENGINE += ["--synthetic-chunk-latency", "0.5"]
# An engine slower than real time: each chunk's first frame leaves at once.
SLOW_ENGINE = ["--synthetic-chunk-frames", "8", "--synthetic-first-chunk-latency", "0.5"]
SLOW_ENGINE += ["--synthetic-chunk-latency", "0.8"]


@dataclass
class StreamFigures:
    frames_sent: int
    frames_received: int
    missing: int
    fps: float
    cpu_per_generated_second: float
    jitter_p95_ms: float


async def measure_throughput(codec: str, seconds: float) -> StreamFigures:
    with server(FAST_ENGINE) as (process, url):
        client = GenerateClient(url, video_codec=codec)
        try:
            await client.connect()
            meter = CpuMeter([process.pid])
            num_frames = int(seconds * FPS)
            await client.start(prompt="a blue whale", size=f"{WIDTH}x{HEIGHT}", fps=FPS, num_frames=num_frames)
            done = await client.wait_event("session.done", timeout=seconds * 3 + 30)
            cpu = meter.cpu_seconds()[0]
            await asyncio.sleep(0.3)  # the last frames are on the wire
            assert client.receiver is not None
            frames = list(client.receiver.frames)
        finally:
            await client.close()
    steady = frames[1:]  # from the second frame on, the pace is the track's
    gaps = [b.at - a.at for a, b in zip(steady, steady[1:])]
    return StreamFigures(
        frames_sent=done["frames"],
        frames_received=len(frames),
        missing=done["frames"] - len({f.index for f in frames}),
        fps=(len(steady) - 1) / (steady[-1].at - steady[0].at),
        cpu_per_generated_second=cpu / (done["frames"] / FPS),
        jitter_p95_ms=round(percentile([abs(g - 1 / FPS) for g in gaps], 95) * 1000, 1),
    )


async def measure_frame_latency(codec: str, chunks: int) -> list[float]:
    """Engine yield (the chunk's `video.chunk_metadata`, sent as the chunk arrives) -> the chunk's
    first frame decoded at the peer, identified by its block code."""
    with server(SLOW_ENGINE) as (_, url):
        client = GenerateClient(url, video_codec=codec)
        try:
            await client.connect()
            await client.start(prompt="a red kite", size=f"{WIDTH}x{HEIGHT}", fps=FPS, num_frames=8 * chunks)
            await client.wait_event("session.done", timeout=chunks * 2 + 30)
            await asyncio.sleep(0.3)
            assert client.receiver is not None
            decoded = {f.index: f.at for f in client.receiver.frames}
            return [
                decoded[event["first_frame_index"]] - at
                for event, at in zip(client.events, client.event_times)
                if event["type"] == "video.chunk_metadata" and event["first_frame_index"] in decoded
            ]
        finally:
            await client.close()
