"""Benchmark one understanding session over loopback and print the figures.

Starts `rtc-omni serve` (synthetic engine) as a subprocess on 127.0.0.1, connects headless aiortc
peers from this process, and measures:
  - offer -> connected (client side), over several connections;
  - RTP frame sent -> its `video.frame.ack` received, for a 640x480@30 VP8 camera;
  - interrupting `video.query` sent -> the talker audio received at the peer going silent;
  - server CPU-seconds per second for one 640x480@30 VP8 + Opus session with a turn every 5 s.

Usage: python benchmarks/understand_loopback.py [--seconds 20] [--json out.json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time

from _common import process_cpu_seconds, silent_from, start_server, summary

from rtc_omni.client.media import ColourVideoTrack, ToneAudioTrack
from rtc_omni.client.peer import UnderstandClient


async def bench_connect(url: str, count: int) -> list[float]:
    times = []
    for _ in range(count):
        client = UnderstandClient(url, audio=ToneAudioTrack())
        await client.connect()
        times.append(client.connect_seconds)
        await client.close()
    return times


async def bench_ack_latency(url: str, seconds: float) -> list[float]:
    video = ColourVideoTrack((40, 90, 200), 640, 480, 30, moving=True)
    client = UnderstandClient(url, video=video, audio=ToneAudioTrack())
    await client.connect()
    await client.configure(sample_fps=10, enable_frame_filter=False)
    await asyncio.sleep(seconds)
    latencies = []
    for event, at in zip(client.events, client.event_times):
        if event["type"] == "video.frame.ack" and event["pts_ms"] is not None:
            sent = video.sent_at.get(round(event["pts_ms"] * 90))
            if sent is not None:
                latencies.append(at - sent)
    await client.close()
    return latencies[5:]  # skip the connection's first frames (keyframe, jitter buffer warm-up)


async def bench_interrupt(url: str, count: int) -> list[float]:
    client = UnderstandClient(url, video=ColourVideoTrack((200, 30, 30), 320, 240, 15), audio=None)
    await client.connect()
    await client.configure()
    await client.wait_event("video.frame.ack")
    results = []
    for i in range(count):
        mark = len(client.events)
        client.send({"type": "video.query", "text": f"tell me about it {i}"})
        await client.wait_event("response.start", after=mark)
        async with asyncio.timeout(10):
            while client.recorder.voiced_frames(since=time.monotonic() - 0.06) < 2:
                await asyncio.sleep(0.005)
        await asyncio.sleep(0.3)  # well into the answer
        mark = len(client.events)
        sent = time.monotonic()
        client.send({"type": "video.query", "text": "stop"})
        await client.wait_event("response.cancelled", after=mark)
        await asyncio.sleep(0.25)
        quiet = silent_from(client.recorder, sent)
        if quiet is not None:
            results.append(quiet - sent)
        # let the interrupting turn finish before the next round
        await client.wait_event("response.audio.done", after=mark, timeout=60)
    await client.close()
    return results


async def bench_cpu(url: str, pid: int, seconds: float) -> float:
    client = UnderstandClient(
        url, video=ColourVideoTrack((40, 90, 200), 640, 480, 30, moving=True), audio=ToneAudioTrack()
    )
    await client.connect()
    await client.configure()
    await asyncio.sleep(2.0)  # steady state
    cpu0, t0 = process_cpu_seconds(pid), time.monotonic()
    next_turn = t0
    while time.monotonic() - t0 < seconds:
        if time.monotonic() >= next_turn:
            client.send({"type": "video.query", "text": "what now?"})
            next_turn += 5.0
        await asyncio.sleep(0.1)
    cpu = (process_cpu_seconds(pid) - cpu0) / (time.monotonic() - t0)
    await client.close()
    return cpu


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=20.0, help="length of the ack and CPU phases")
    parser.add_argument("--connects", type=int, default=10)
    parser.add_argument("--interrupts", type=int, default=10)
    parser.add_argument("--json", help="also write the raw figures here")
    args = parser.parse_args()

    process, url = start_server()
    try:
        idle_cpu0 = process_cpu_seconds(process.pid)
        await asyncio.sleep(2.0)
        idle_cpu = (process_cpu_seconds(process.pid) - idle_cpu0) / 2.0
        connect = await bench_connect(url, args.connects)
        acks = await bench_ack_latency(url, args.seconds)
        interrupts = await bench_interrupt(url, args.interrupts)
        cpu = await bench_cpu(url, process.pid, args.seconds)
    finally:
        process.terminate()
        process.wait(timeout=15)

    print(f"machine: {os.cpu_count()} cores, Python {sys.version.split()[0]}")
    print(f"offer -> connected:              {summary(connect)}")
    print(f"RTP frame -> video.frame.ack:    {summary(acks)}  (640x480@30 VP8, sampled at 10 fps)")
    print(f"interrupt -> silence at peer:    {summary(interrupts)}")
    print(
        f"server CPU, one session:         {cpu:.3f} CPU-s/s  (640x480@30 VP8 + Opus in, talker Opus out, "
        f"a turn every 5 s; idle server {idle_cpu:.3f})"
    )
    if args.json:
        with open(args.json, "w") as out:
            json.dump(
                {
                    "connect_s": connect,
                    "ack_latency_s": acks,
                    "interrupt_to_silence_s": interrupts,
                    "server_cpu_s_per_s": cpu,
                    "idle_cpu_s_per_s": idle_cpu,
                },
                out,
                indent=1,
            )


if __name__ == "__main__":
    asyncio.run(main())
