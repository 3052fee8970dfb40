"""Benchmark generated video over loopback and print the figures.

Starts `rtc-omni serve` (synthetic engines) as subprocesses on 127.0.0.1 and receives generated
video with a headless aiortc peer, decoding each frame's block code. For VP8 and for H.264:
  - sustained frames/s received and server CPU-seconds per generated second (832x480@16, an
    engine faster than real time, so the track's pacing sets the rate);
  - inter-frame pacing jitter: |arrival gap - 1/fps|, p95;
  - engine yield -> frame decoded at the peer, p50/p95, with an engine slower than real time
    (each chunk's first frame then leaves at once; the chunk's `video.chunk_metadata` marks the yield).

Usage: python benchmarks/generate_loopback.py [--seconds 20] [--json out.json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys

from _common import percentile, process_cpu_seconds, start_server, summary

from rtc_omni.client.peer import GenerateClient

WIDTH, HEIGHT, FPS = 832, 480, 16


async def bench_throughput(codec: str, seconds: float) -> dict[str, float]:
    process, url = start_server(
        ["--synthetic-chunk-frames", "33", "--synthetic-first-chunk-latency", "1.0", "--synthetic-chunk-latency", "0.5"]
    )
    try:
        client = GenerateClient(url, video_codec=codec)
        await client.connect()
        cpu0 = process_cpu_seconds(process.pid)
        await client.start(prompt="a blue whale", size=f"{WIDTH}x{HEIGHT}", fps=FPS, num_frames=int(seconds * FPS))
        done = await client.wait_event("session.done", timeout=seconds * 3 + 30)
        cpu = process_cpu_seconds(process.pid) - cpu0
        await asyncio.sleep(0.3)
        frames = list(client.receiver.frames)
        await client.close()
    finally:
        process.terminate()
        process.wait(timeout=15)
    steady = frames[1:]  # from the second frame on, the pace is the track's
    span = steady[-1].at - steady[0].at
    gaps = [b.at - a.at for a, b in zip(steady, steady[1:])]
    return {
        "frames_sent": done["frames"],
        "frames_received": len(frames),
        "missing": done["frames"] - len({f.index for f in frames}),
        "fps": (len(steady) - 1) / span,
        "cpu_per_generated_second": cpu / (done["frames"] / FPS),
        "jitter_p95_ms": percentile([abs(g - 1 / FPS) for g in gaps], 95) * 1000,
    }


async def bench_latency(codec: str, chunks: int) -> list[float]:
    process, url = start_server(
        ["--synthetic-chunk-frames", "8", "--synthetic-first-chunk-latency", "0.5", "--synthetic-chunk-latency", "0.8"]
    )
    try:
        client = GenerateClient(url, video_codec=codec)
        await client.connect()
        await client.start(prompt="a red kite", size=f"{WIDTH}x{HEIGHT}", fps=FPS, num_frames=8 * chunks)
        await client.wait_event("session.done", timeout=chunks * 2 + 30)
        await asyncio.sleep(0.3)
        decoded = {f.index: f.at for f in client.receiver.frames}
        latencies = []
        for event, at in zip(client.events, client.event_times):
            if event["type"] == "video.chunk_metadata" and event["first_frame_index"] in decoded:
                latencies.append(decoded[event["first_frame_index"]] - at)
        await client.close()
        return latencies
    finally:
        process.terminate()
        process.wait(timeout=15)


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=20.0, help="seconds of video per throughput run")
    parser.add_argument("--chunks", type=int, default=15, help="chunks in each latency run")
    parser.add_argument("--json", help="also write the figures here")
    args = parser.parse_args()
    results = {}
    print(f"machine: {os.cpu_count()} cores, Python {sys.version.split()[0]}; {WIDTH}x{HEIGHT}@{FPS}")
    for codec in ("vp8", "h264"):
        throughput = await bench_throughput(codec, args.seconds)
        latency = await bench_latency(codec, args.chunks)
        results[codec] = {**throughput, "yield_to_decoded_s": latency}
        print(
            f"{codec:>5}: {throughput['frames_received']}/{throughput['frames_sent']} frames "
            f"({throughput['missing']} missing), sustained {throughput['fps']:.2f} fps, "
            f"server {throughput['cpu_per_generated_second']:.3f} CPU-s per generated s, "
            f"pacing jitter p95 {throughput['jitter_p95_ms']:.1f} ms; "
            f"engine yield -> decoded {summary(latency)}"
        )
    if args.json:
        with open(args.json, "w") as out:
            json.dump(results, out, indent=1)


if __name__ == "__main__":
    asyncio.run(main())
