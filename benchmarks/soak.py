"""Soak the server with sessions and turns for minutes, and print its memory, fds and tasks over time.

A leak shows as a resident set, an open-fd count or an asyncio task count that keeps climbing
while the load stays the same; each round opens and closes every kind of session, so whatever a
session holds must be given back by the round's end. The figures come from the server's own
`GET /metrics` (process_resident_memory_bytes, process_open_fds, rtc_omni_asyncio_tasks).

Each round (bounded in count and time, loopback only):
  - an understanding session over WebRTC (160x120 camera, 440 Hz tone): a spoken turn interrupted
    by a second one that plays to its end, then the peer closes;
  - a generation session over WebRTC: 40 frames of 128x96, received to the end;
  - an understanding session over the WebSocket endpoint: one frame, one text turn.

Usage: python benchmarks/soak.py [--minutes 10] [--sample-every 30]
Run it inside a loopback-only network namespace, like the tests.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import io
import json
import time
import urllib.request
from dataclasses import dataclass

import aiohttp
from PIL import Image
from prometheus_client.parser import text_string_to_metric_families

from rtc_omni import patches
from rtc_omni.bench.common import server
from rtc_omni.client.media import COLOURS, ColourVideoTrack, ToneAudioTrack
from rtc_omni.client.rtc_peers import GenerateClient, UnderstandClient


@dataclass
class Sample:
    at_s: float
    rounds: int
    rss_mib: float
    open_fds: int
    tasks: int
    sessions: int


def scrape(url: str, at_s: float, rounds: int) -> Sample:
    with urllib.request.urlopen(url + "/metrics", timeout=10) as response:
        text = response.read().decode()
    values: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            values[sample.name] = values.get(sample.name, 0.0) + sample.value
    return Sample(
        at_s=round(at_s, 1),
        rounds=rounds,
        rss_mib=round(values["process_resident_memory_bytes"] / 2**20, 1),
        open_fds=int(values["process_open_fds"]),
        tasks=int(values["rtc_omni_asyncio_tasks"]),
        sessions=int(values.get("rtc_omni_sessions", 0)),
    )


async def understand_round(url: str) -> None:
    client = UnderstandClient(url, video=ColourVideoTrack(COLOURS["red"], 160, 120, 15), audio=ToneAudioTrack(440.0))
    try:
        await client.connect()
        await client.configure(modalities=["text", "audio"], audio_events=True)
        await client.wait_event("video.frame.ack")
        mark = len(client.events)
        client.send({"type": "video.query", "text": "Describe it slowly."})
        await client.wait_event("response.audio.delta", after=mark, timeout=30)
        await client.ask("Stop. What colour?", timeout=60)  # interrupts the spoken answer, then is heard
    finally:
        await client.close()


async def generate_round(url: str) -> None:
    client = GenerateClient(url)
    try:
        await client.connect()
        await client.start(prompt="a red ball", size="128x96", fps=20, num_frames=40)
        await client.wait_event("session.done", timeout=60)
    finally:
        await client.close()


def _jpeg_b64() -> str:
    out = io.BytesIO()
    Image.new("RGB", (160, 120), (0, 0, 255)).save(out, format="JPEG")
    return base64.b64encode(out.getvalue()).decode("ascii")


async def websocket_round(url: str) -> None:
    async with aiohttp.ClientSession() as http:
        async with http.ws_connect(url.replace("http://", "ws://") + "/v1/video/chat/stream") as ws:
            await ws.send_json({"type": "session.config", "modalities": ["text"]})
            await ws.send_json({"type": "video.frame", "data": _jpeg_b64()})
            await ws.send_json({"type": "video.query", "text": "What colour?"})
            async with asyncio.timeout(30):
                async for message in ws:
                    if json.loads(message.data).get("type") == "response.text.done":
                        break
            await ws.send_json({"type": "video.done"})


async def soak(url: str, minutes: float, sample_every: float) -> list[Sample]:
    started = time.monotonic()
    deadline = started + minutes * 60
    samples = [scrape(url, 0.0, 0)]
    next_sample = started + sample_every
    rounds = 0
    max_rounds = int(minutes * 60)  # a bound on the loop whatever the speed
    while time.monotonic() < deadline and rounds < max_rounds:
        async with asyncio.timeout(120), asyncio.TaskGroup() as round_tasks:
            for one_round in (understand_round, generate_round, websocket_round):
                round_tasks.create_task(one_round(url))
        rounds += 1
        if time.monotonic() >= next_sample:
            await asyncio.sleep(1.0)  # let the closed peers' last tasks finish
            samples.append(scrape(url, time.monotonic() - started, rounds))
            print(_row(samples[-1]), flush=True)
            next_sample += sample_every
    await asyncio.sleep(3.0)
    samples.append(scrape(url, time.monotonic() - started, rounds))
    return samples


def _row(s: Sample) -> str:
    return f"{s.at_s:8.1f} {s.rounds:7d} {s.rss_mib:9.1f} {s.open_fds:6d} {s.tasks:6d} {s.sessions:9d}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--minutes", type=float, default=10.0, help="how long to soak")
    parser.add_argument("--sample-every", type=float, default=30.0, help="seconds between /metrics samples")
    args = parser.parse_args()
    patches.apply()  # the headless peers gather on 127.0.0.1 only
    with server(["--idle-timeout", "30"]) as (_, url):
        print(f"{'t (s)':>8} {'rounds':>7} {'RSS MiB':>9} {'fds':>6} {'tasks':>6} {'sessions':>9}")
        samples = asyncio.run(soak(url, args.minutes, args.sample_every))
    first = samples[1] if len(samples) > 2 else samples[0]  # after one round: imports and caches warm
    last = samples[-1]
    print(_row(last), "(end, all sessions closed)")
    print(
        f"after round {first.rounds} -> end ({last.rounds} rounds): RSS {first.rss_mib} -> {last.rss_mib} MiB "
        f"({last.rss_mib - first.rss_mib:+.1f}), fds {first.open_fds} -> {last.open_fds}, "
        f"tasks {first.tasks} -> {last.tasks}, sessions left {last.sessions}"
    )


if __name__ == "__main__":
    main()
