"""Benchmark the bridge: what a gateway (`--engine remote`) in front of a backend adds, over loopback.

Starts two `rtc-omni serve` subprocesses on 127.0.0.1: a backend on the synthetic engine (serving
vLLM-Omni's WebSocket endpoints) and a gateway whose engine is that backend. Headless aiortc peers
from this process measure, through the gateway and directly against the backend:
  - RTP frame sent -> its `video.frame.ack` received (ingest stays local to the gateway);
  - `video.query` sent -> first text delta, and -> first voiced talker audio at the peer;
  - CPU-seconds per second of each process for one 640x480@30 VP8 + Opus session, a turn every 5 s.

Usage: python benchmarks/bridge_loopback.py [--seconds 15] [--turns 8] [--json out.json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
from dataclasses import asdict, dataclass

from rtc_omni import patches
from rtc_omni.bench.common import CpuMeter, start_server, stop, summary
from rtc_omni.bench.understand_latency import camera, measure_ingest
from rtc_omni.client.media import ColourVideoTrack, ToneAudioTrack
from rtc_omni.client.rtc_peers import UnderstandClient


async def bench_turns(url: str, turns: int) -> tuple[list[float], list[float]]:
    """(query -> first text delta, query -> first voiced audio) per turn, in seconds."""
    client = UnderstandClient(url, video=ColourVideoTrack((200, 30, 30), 320, 240, 15), audio=None)
    await client.connect()
    await client.configure()
    await client.wait_event("video.frame.ack")
    first_text, first_audio = [], []
    for i in range(turns):
        mark = len(client.events)
        sent = time.monotonic()
        client.send({"type": "video.query", "text": f"what do you see {i}"})
        delta = await client.wait_event("response.text.delta", after=mark, timeout=30)
        first_text.append(client.event_times[client.events.index(delta)] - sent)
        async with asyncio.timeout(30):
            while client.recorder.voiced_frames(since=sent) == 0:
                await asyncio.sleep(0.005)
        voiced = next(f.at for f in client.recorder.frames if f.at >= sent and f.rms >= client.recorder.SILENCE_RMS)
        first_audio.append(voiced - sent)
        await client.wait_event("response.audio.done", after=mark, timeout=60)
        await asyncio.sleep(1.0)  # what was in flight at audio.done plays out: the next turn starts silent
    await client.close()
    return first_text, first_audio


async def bench_cpu(url: str, pids: list[int], seconds: float) -> list[float]:
    client = UnderstandClient(url, video=camera(), audio=ToneAudioTrack())
    await client.connect()
    await client.configure()
    await asyncio.sleep(2.0)
    meter, t0 = CpuMeter(pids), time.monotonic()
    next_turn = t0
    while time.monotonic() - t0 < seconds:
        if time.monotonic() >= next_turn:
            client.send({"type": "video.query", "text": "what now?"})
            next_turn += 5.0
        await asyncio.sleep(0.1)
    cpu = meter.per_second()
    await client.close()
    return cpu


@dataclass
class Figures:
    ack_latency_s: list[float]
    first_text_s: list[float]
    first_audio_s: list[float]
    cpu_s_per_s: list[float]  # per process: [backend] direct, [gateway, backend] bridged


async def measure(url: str, pids: list[int], args: argparse.Namespace) -> Figures:
    acks = (await measure_ingest(url, "vp8", args.seconds)).ack_s
    first_text, first_audio = await bench_turns(url, args.turns)
    return Figures(acks, first_text, first_audio, await bench_cpu(url, pids, args.seconds))


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=15.0, help="length of the ack and CPU phases")
    parser.add_argument("--turns", type=int, default=8)
    parser.add_argument("--json", help="also write the raw figures here")
    args = parser.parse_args()

    patches.apply()  # the headless peers gather on 127.0.0.1 only
    backend, backend_url = start_server()
    gateway, gateway_url = start_server(["--engine", "remote", "--upstream", backend_url.replace("http", "ws", 1)])
    try:
        direct = await measure(backend_url, [backend.pid], args)
        bridged = await measure(gateway_url, [gateway.pid, backend.pid], args)
    finally:
        for process in (gateway, backend):
            stop(process)

    print(f"machine: {os.cpu_count()} cores, Python {sys.version.split()[0]}")
    for name, figures in (("direct ", direct), ("bridged", bridged)):
        print(f"{name} RTP frame -> ack:            {summary(figures.ack_latency_s)}")
        print(f"{name} query -> first text delta:   {summary(figures.first_text_s)}")
        print(f"{name} query -> first voiced audio: {summary(figures.first_audio_s)}")
    print(f"CPU, one session direct:  backend {direct.cpu_s_per_s[0]:.3f} CPU-s/s")
    gateway_cpu, backend_cpu = bridged.cpu_s_per_s
    print(
        f"CPU, one bridged session: gateway {gateway_cpu:.3f} CPU-s/s, backend {backend_cpu:.3f} CPU-s/s "
        "(640x480@30 VP8 + Opus in, talker Opus out, a turn every 5 s)"
    )
    if args.json:
        with open(args.json, "w") as out:
            json.dump({"direct": asdict(direct), "bridged": asdict(bridged)}, out, indent=1)


if __name__ == "__main__":
    asyncio.run(main())
