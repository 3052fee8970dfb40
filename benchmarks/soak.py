"""Soak the server with every kind of session for an hour, and print its memory, fds, tasks and threads.

A leak shows as a resident set, an open-fd, asyncio-task or thread count that keeps climbing while
the load stays the same; each round opens, talks to and closes every kind of session at once, so
whatever a session holds must be given back by the round's end. Between rounds, about every
--sample-every seconds, the script reads the server's own `GET /metrics` (resident memory, open
fds, asyncio tasks, live sessions) and its thread count (`Threads:` in /proc/PID/status).

Each round (bounded in count and time, loopback only), all kinds concurrently:
  - understanding over WebRTC (160x120 camera, 440 Hz tone): a spoken turn interrupted by a second
    that plays to its end, then the peer closes;
  - generation over WebRTC (40 frames of 128x96) with a WHEP viewer watching, both to the end;
  - understanding over `WS /v1/video/chat/stream`: one frame, one text turn;
  - realtime over `WS /v1/realtime` with the `openai` SDK: a text turn, then, in a second session,
    a tool round trip (get_weather called, its output sent, the spoken answer);
  - realtime over WebRTC (`client.realtime.calls.create`, an aiortc peer, `oai-events`): a spoken
    response cancelled a second into its speech;
  - a WHIP publisher (camera and tone) with a WHEP viewer hearing its talker and a controller
    attached asking about both, each then DELETEd.

The server runs with PYTHONTRACEMALLOC=1 and JSON logs: after the first round and at the end the
script sends it SIGUSR1 (rtc_omni/allocations.py) and prints the top allocation sites it logs, and
at the end those that grew in between.

Usage: python benchmarks/soak.py [--minutes 60] [--sample-every 60]
From the repository root, inside a loopback-only network namespace, like the tests (it reuses the
tests' WHIP and WHEP peers and the realtime benchmarks' clients).
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import io
import json
import os
import signal
import tempfile
import time
import urllib.request
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace

import aiohttp
from aiortc import RTCSessionDescription
from openai import AsyncOpenAI
from PIL import Image
from prometheus_client.parser import text_string_to_metric_families

from benchmarks.realtime_loopback import QUESTION, one_cancel
from benchmarks.realtime_loopback import until as next_event
from benchmarks.realtime_tools import rounds as tool_round_trips
from rtc_omni import patches
from rtc_omni.bench.common import server, summary
from rtc_omni.client.media import COLOURS, ColourVideoTrack, ToneAudioTrack
from rtc_omni.client.rtc_peers import GenerateClient, UnderstandClient
from tests.whep_player import WhepPlayer
from tests.whip_client import SDP, http_raw, publisher_offer

KIND_TIMEOUT_S = 120.0  # one kind's part of a round, connect to close
REPORT_TIMEOUT_S = 120.0  # the server's allocation report, after SIGUSR1 (seconds on a large heap)
SERVER_ARGS = ["--idle-timeout", "30", "--session-rate-limit", "0", "--log-level", "info", "--log-format", "json"]


@dataclass
class Sample:
    at_s: float
    rounds: int
    rss_mib: float
    open_fds: int
    tasks: int
    threads: int
    sessions: int
    failures: int


def threads_of(pid: int) -> int:
    with open(f"/proc/{pid}/status") as status:
        return int(next(line for line in status if line.startswith("Threads:")).split()[1])


def scrape(url: str, pid: int, at_s: float, rounds: int, failures: int) -> Sample:
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
        threads=threads_of(pid),
        sessions=int(values.get("rtc_omni_sessions", 0)),
        failures=failures,
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


def viewing(view_token: str | None) -> dict[str, str]:
    return {"Authorization": f"Bearer {view_token}"}


async def generate_round(url: str) -> None:
    client = GenerateClient(url)
    viewer = WhepPlayer("video")
    try:
        await client.connect()
        assert client.session_id is not None
        await viewer.play(SimpleNamespace(url=url), client.session_id, viewing(client.view_token))
        await client.start(prompt="a red ball", size="128x96", fps=20, num_frames=40)
        await client.wait_event("session.done", timeout=60)
        await asyncio.sleep(0.5)  # the last frames in flight
        if viewer.video is None or not viewer.video.frames:
            raise RuntimeError("the WHEP viewer saw no frame of the generated video")
    finally:
        await viewer.close()
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


async def realtime_ws_round(url: str) -> None:
    client = AsyncOpenAI(base_url=url + "/v1", api_key="sk-soak")
    try:
        async with client.realtime.connect(model="qwen3-omni") as connection:
            text_only = {"type": "realtime", "output_modalities": ["text"]}
            await connection.send({"type": "session.update", "session": text_only})
            await next_event(connection, "session.updated")
            await connection.send(QUESTION)
            await connection.send({"type": "response.create"})
            await next_event(connection, "response.done")
    finally:
        await client.close()
    await tool_round_trips(url, 1)


async def realtime_call_round(url: str, cancels: list[float]) -> None:
    client = AsyncOpenAI(base_url=url + "/v1", api_key="sk-soak")
    try:
        cancels.append(await one_cancel(client, plain=True))
    finally:
        await client.close()


async def ask_spoken(url: str, session_id: str, session_token: str) -> None:
    """A controller attached to a publisher's session asks about what it sends, and hears the answer."""
    controller = UnderstandClient(url, video=None, audio=None, token=session_token)
    try:
        await controller.connect(kind="control", session_id=session_id)
        await controller.configure(modalities=["text", "audio"])
        await controller.wait_event("video.frame.ack", timeout=10)
        await controller.ask("What do you see and hear?", timeout=60)
    finally:
        await controller.close()


async def whip_round(url: str) -> None:
    target = SimpleNamespace(url=url)  # what the tests' WHIP and WHEP helpers read of a server
    publisher, offer = await publisher_offer()
    listener = WhepPlayer("audio")
    try:
        status, headers, answer = await http_raw(target, "POST", "/whip", data=offer, headers=SDP)
        if status != 201:
            raise RuntimeError(f"WHIP POST answered {status}: {answer[:200]}")
        await publisher.setRemoteDescription(RTCSessionDescription(sdp=answer, type="answer"))
        session_id = headers["Location"].split("?")[0].rsplit("/", 1)[1]
        await listener.play(target, session_id, viewing(headers["View-Token"]))
        await ask_spoken(url, session_id, headers["Session-Token"])
        if listener.audio is None or not listener.audio.voiced_frames():
            raise RuntimeError("the WHEP listener heard none of the talker")
        for location in (listener.location, headers["Location"]):
            status, _, body = await http_raw(target, "DELETE", location, headers=viewing(headers["Session-Token"]))
            if status != 200:
                raise RuntimeError(f"DELETE {location} answered {status}: {body[:200]}")
    finally:
        await listener.close()
        await publisher.close()


def kinds(cancels: list[float]) -> dict[str, Callable[[str], Awaitable[None]]]:
    return {
        "understand (WebRTC)": understand_round,
        "generate + WHEP viewer": generate_round,
        "understand (WebSocket)": websocket_round,
        "realtime (WebSocket)": realtime_ws_round,
        "realtime (WebRTC)": lambda url: realtime_call_round(url, cancels),
        "WHIP + WHEP + controller": whip_round,
    }


async def one_round(url: str, cancels: list[float], failures: Counter[str], number: int) -> None:
    """Every kind at once; a kind that fails is counted and said, and the soak goes on."""

    async def bounded(run: Callable[[str], Awaitable[None]]) -> None:
        async with asyncio.timeout(KIND_TIMEOUT_S):
            await run(url)

    every = kinds(cancels)
    results = await asyncio.gather(*(bounded(run) for run in every.values()), return_exceptions=True)
    for kind, result in zip(every, results):
        if isinstance(result, BaseException):
            failures[kind] += 1
            print(f"round {number}: {kind} failed: {type(result).__name__}: {str(result)[:300]}", flush=True)


class AllocationLog:
    """The server's allocation reports (rtc_omni/allocations.py), asked for with SIGUSR1, read from its
    JSON log."""

    def __init__(self, pid: int, log: Path) -> None:
        self.pid, self.log, self.seen = pid, log, 0

    async def report(self) -> str:
        os.kill(self.pid, signal.SIGUSR1)
        async with asyncio.timeout(REPORT_TIMEOUT_S):
            while len(reports := self._reports()) == self.seen:
                await asyncio.sleep(0.5)
        self.seen = len(reports)
        return reports[-1]

    def _reports(self) -> list[str]:
        lines = (json.loads(line) for line in self.log.read_text().splitlines() if line.startswith("{"))
        return [line["message"] for line in lines if line["logger"] == "rtc_omni.allocations"]


async def soak(url: str, pid: int, log: Path, minutes: float, sample_every: float) -> list[Sample]:
    allocations = AllocationLog(pid, log)
    cancels: list[float] = []
    failures: Counter[str] = Counter()
    started = time.monotonic()
    deadline = started + minutes * 60
    samples = [scrape(url, pid, 0.0, 0, 0)]
    print(_row(samples[0]), "(before the first round)", flush=True)
    next_sample = started + sample_every
    rounds = 0
    max_rounds = int(minutes * 60)  # a bound on the loop whatever the speed
    while time.monotonic() < deadline and rounds < max_rounds:
        await one_round(url, cancels, failures, rounds + 1)
        rounds += 1
        if rounds == 1:
            await asyncio.sleep(1.0)
            samples.append(scrape(url, pid, time.monotonic() - started, rounds, failures.total()))
            print(_row(samples[-1]), "(after the first round)", flush=True)
            print(await allocations.report(), flush=True)
        if time.monotonic() >= next_sample:
            await asyncio.sleep(1.0)  # let the closed peers' last tasks finish
            samples.append(scrape(url, pid, time.monotonic() - started, rounds, failures.total()))
            print(_row(samples[-1]), flush=True)
            next_sample += sample_every
    await asyncio.sleep(3.0)
    samples.append(scrape(url, pid, time.monotonic() - started, rounds, failures.total()))
    print(_row(samples[-1]), "(end, all sessions closed)", flush=True)
    print(await allocations.report(), flush=True)
    print(f"failures by kind: {dict(failures) or 'none'}")
    print(f"realtime WebRTC: response.cancel -> last voiced frame at a plain aiortc peer: {summary(cancels)}")
    return samples


HEADER = (
    f"{'t (s)':>8} {'rounds':>7} {'RSS MiB':>9} {'fds':>6} {'tasks':>6} {'threads':>8} {'sessions':>9} {'failed':>7}"
)


def _row(s: Sample) -> str:
    return (
        f"{s.at_s:8.1f} {s.rounds:7d} {s.rss_mib:9.1f} {s.open_fds:6d} {s.tasks:6d} {s.threads:8d} "
        f"{s.sessions:9d} {s.failures:7d}"
    )


def verdict(samples: list[Sample]) -> str:
    """After the first round, after ten minutes (when the soak lasted that long) and at the end."""
    first, last = samples[1], samples[-1]
    ten = next((s for s in samples[1:-1] if s.at_s >= 600), None)
    lines = [
        f"after round {first.rounds} -> end ({last.rounds} rounds): RSS {first.rss_mib} -> {last.rss_mib} MiB, "
        f"fds {first.open_fds} -> {last.open_fds}, tasks {first.tasks} -> {last.tasks}, "
        f"threads {first.threads} -> {last.threads}, sessions left {last.sessions}"
    ]
    if ten is not None:
        change = 100 * (last.rss_mib - ten.rss_mib) / ten.rss_mib
        lines.append(f"RSS after {ten.at_s:.0f} s -> end: {ten.rss_mib} -> {last.rss_mib} MiB ({change:+.1f} %)")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--minutes", type=float, default=60.0, help="how long to soak")
    parser.add_argument("--sample-every", type=float, default=60.0, help="seconds between samples")
    args = parser.parse_args()
    patches.apply()  # the headless peers gather on 127.0.0.1 only
    log = Path(tempfile.mkstemp(prefix="soak-server-", suffix=".log")[1])
    print(f"server log: {log}")
    with log.open("wb") as out, server(SERVER_ARGS, env={"PYTHONTRACEMALLOC": "1"}, log=out) as (process, url):
        print(HEADER)
        samples = asyncio.run(soak(url, process.pid, log, args.minutes, args.sample_every))
    print(verdict(samples))


if __name__ == "__main__":
    main()
