"""Benchmark the realtime bridge: WebRTC realtime calls through a gateway (`--engine remote`) that keeps
each conversation in an upstream vLLM-Omni duplex `/v1/realtime` session, beside the older path
(`--upstream-protocol legacy`: each response one `/v1/video/chat/stream` turn, with the camera's frames).

The upstreams are vLLM-Omni 0.30's genuine handlers with fake models (tests/vllm_cpu/genuine_server.py,
in the vLLM-Omni environment named by RTC_OMNI_VLLM_PYTHON): the duplex one's speech starts after
--first-audio-delay (default 0 here) and is generated in real time; the older one's comes at once.
The gateway is `rtc-omni serve` in a subprocess. Each call is an aiortc peer with a 320x240@15 camera
and a microphone, asking a question (a text item and `response.create`) every --every seconds.
Printed per path:
  - `response.create` -> the first transcript delta (DataChannel), and -> the first voiced talker frame
    the peer decodes (p50/p95);
  - the talker audio per response (the fakes' answers differ in length; CPU follows it);
  - the gateway's CPU-seconds per second per call, with 1 call and with --calls calls;
  - on /v1/realtime, `response.cancel` sent by the peer -> the upstream's handler has it (its record's
    time.monotonic(), one clock for every process on the machine), cancelled half a second into speech.

Usage: python benchmarks/realtime_upstream.py [--turns 8] [--calls 8] [--seconds 20]
Run it inside a loopback-only network namespace, like the tests.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from aiortc import RTCPeerConnection, RTCSessionDescription
from openai import AsyncOpenAI

from rtc_omni import patches
from rtc_omni.bench.common import CpuMeter, start_server, stop, summary
from rtc_omni.client.media import COLOURS, AudioRecorder, ColourVideoTrack, ToneAudioTrack
from rtc_omni.signaling.ice import rtc_configuration
from tests.genuine import Genuine

TIMEOUT_S = 30.0
QUESTION = {
    "type": "conversation.item.create",
    "item": {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "What do you see?"}]},
}


@dataclass
class BenchCall:
    """One WebRTC realtime call with a camera and a microphone."""

    pc: RTCPeerConnection = field(default_factory=lambda: RTCPeerConnection(rtc_configuration([])))
    recorders: list[AudioRecorder] = field(default_factory=list)
    events: asyncio.Queue[dict[str, Any]] = field(default_factory=asyncio.Queue)

    async def connect(self, url: str) -> None:
        self.channel = self.pc.createDataChannel("oai-events")
        self.pc.addTrack(ToneAudioTrack(330.0))  # sendrecv: the microphone out, the talker back
        self.pc.addTransceiver(ColourVideoTrack(COLOURS["green"], 320, 240, 15), direction="sendonly")
        self.pc.on("track", lambda track: self.recorders.append(AudioRecorder(track)))
        self.channel.on("message", lambda message: self.events.put_nowait(json.loads(message)))
        await self.pc.setLocalDescription(await self.pc.createOffer())
        client = AsyncOpenAI(base_url=url + "/v1", api_key="sk-bench")
        session = {"type": "realtime", "audio": {"input": {"turn_detection": None}}}
        answer = await client.realtime.calls.create(sdp=self.pc.localDescription.sdp, session=session)
        await client.close()
        await self.pc.setRemoteDescription(RTCSessionDescription(sdp=answer.text, type="answer"))
        async with asyncio.timeout(TIMEOUT_S):
            while self.channel.readyState != "open" or not self.recorders:
                await asyncio.sleep(0.01)
        await asyncio.sleep(1.0)  # camera frames buffered: the older path answers only with one

    async def ask(self) -> tuple[float, float, float]:
        """(response.create -> first transcript delta, -> first voiced frame at the peer, seconds of
        talker audio) for one response."""
        self.channel.send(json.dumps(QUESTION))
        sent = time.monotonic()
        self.channel.send(json.dumps({"type": "response.create"}))
        recorder = self.recorders[0]
        first_text = None
        async with asyncio.timeout(TIMEOUT_S):
            while (event := await self.events.get())["type"] != "response.done":
                if first_text is None and event["type"] == "response.output_audio_transcript.delta":
                    first_text = time.monotonic() - sent
            while recorder.voiced_frames(since=sent) == 0:
                await asyncio.sleep(0.005)
        if event["response"]["status"] != "completed" or first_text is None:
            raise RuntimeError(f"a response {event['response']['status']}: {event['response'].get('status_details')}")
        await asyncio.sleep(0.5)  # the speech has played out at the peer (response.done waits for it)
        first = next(f.at for f in recorder.frames if f.at >= sent and f.rms >= recorder.SILENCE_RMS)
        return first_text, first - sent, recorder.voiced_frames(since=sent) * 0.02

    async def cancel_after_speech(self) -> float:
        """A response cancelled half a second into its speech; when the cancel was sent."""
        self.channel.send(json.dumps(QUESTION))
        sent = time.monotonic()
        self.channel.send(json.dumps({"type": "response.create"}))
        async with asyncio.timeout(TIMEOUT_S):
            while self.recorders[0].voiced_frames(since=sent) < 25:
                await asyncio.sleep(0.005)
            cancelled = time.monotonic()
            self.channel.send(json.dumps({"type": "response.cancel"}))
            while (await self.events.get())["type"] != "response.done":
                pass
        return cancelled

    async def close(self) -> None:
        for recorder in self.recorders:
            await recorder.stop()
        await self.pc.close()


@dataclass
class Figures:
    first_text_s: list[float] = field(default_factory=list)
    first_audio_s: list[float] = field(default_factory=list)
    cancel_s: list[float] = field(default_factory=list)
    speech_s: list[float] = field(default_factory=list)
    cpu_one: float = 0.0  # gateway CPU-s/s with one call
    cpu_many: float = 0.0  # gateway CPU-s/s with --calls calls


async def latencies(url: str, turns: int, figures: Figures) -> None:
    call = BenchCall()
    await call.connect(url)
    try:
        for _ in range(turns):
            text, first, speech = await call.ask()
            figures.first_text_s.append(text)
            figures.first_audio_s.append(first)
            figures.speech_s.append(speech)
            await asyncio.sleep(0.5)
    finally:
        await call.close()


def cancels_since(sent: float, record: dict[str, list[Any]]) -> list[float]:
    """When the upstream had each `response.cancel` that came after `sent`."""
    return [c["t"] for c in record["commands"] if c["type"] == "CancelResponse" and c["t"] > sent]


async def cancels(url: str, upstream: Genuine, trials: int, figures: Figures) -> None:
    call = BenchCall()
    await call.connect(url)
    try:
        for _ in range(trials):
            sent = await call.cancel_after_speech()
            arrived = partial(cancels_since, sent)
            figures.cancel_s.append(arrived(await upstream.wait_record(arrived, TIMEOUT_S))[0] - sent)
            await asyncio.sleep(1.0)
    finally:
        await call.close()


async def cpu_per_second(url: str, pid: int, calls: int, seconds: float, every: float) -> float:
    """The gateway's CPU-s/s with `calls` calls, each asking every `every` seconds (staggered)."""
    peers = [BenchCall() for _ in range(calls)]
    for peer in peers:
        await peer.connect(url)

    async def asking(peer: BenchCall, offset: float) -> None:
        await asyncio.sleep(offset)
        while True:
            await peer.ask()
            await asyncio.sleep(every)

    try:
        tasks = [asyncio.create_task(asking(peer, i * every / calls)) for i, peer in enumerate(peers)]
        await asyncio.sleep(every)  # every call is asking
        meter = CpuMeter([pid])
        await asyncio.sleep(seconds)
        cpu = meter.per_second()[0]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        return cpu
    finally:
        for peer in peers:
            await peer.close()


async def measure(upstream: Genuine, protocol: str, args: argparse.Namespace) -> Figures:
    gateway, url = start_server(["--engine", "remote", "--upstream", upstream.url, "--upstream-protocol", protocol])
    figures = Figures()
    try:
        await latencies(url, args.turns, figures)
        if protocol == "realtime":
            await cancels(url, upstream, args.turns, figures)
        figures.cpu_one = await cpu_per_second(url, gateway.pid, 1, args.seconds, args.every)
        figures.cpu_many = await cpu_per_second(url, gateway.pid, args.calls, args.seconds, args.every)
    finally:
        stop(gateway)
    return figures


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--turns", type=int, default=8, help="responses timed, one call")
    parser.add_argument("--calls", type=int, default=8, help="calls at once for the CPU figure")
    parser.add_argument("--seconds", type=float, default=20.0, help="length of each CPU measurement")
    parser.add_argument("--every", type=float, default=5.0, help="seconds between a call's responses")
    parser.add_argument("--first-audio-delay", type=float, default=0.0, help="the duplex fake's, seconds")
    # The duplex fake's answer lists its whole history, so it grows each turn: at this pace the first
    # is about as long as the older fake's 1.2 s, and long enough to be cancelled half a second in.
    parser.add_argument("--seconds-per-char", type=float, default=0.012, help="the duplex fake's speech")
    args = parser.parse_args()

    patches.apply()  # the headless peers gather on 127.0.0.1 only
    delay = str(args.first_audio_delay)
    # Speech generated in real time (a 0.2 s chunk every 0.2 s): a cancel finds the answer still running.
    pace = ["--first-audio-delay", delay, "--chunk-interval", "0.2", "--seconds-per-char", str(args.seconds_per_char)]
    duplex = Genuine("--kind", "realtime", "--max-sessions", str(2 * args.calls), *pace)
    older = Genuine("--kind", "understand")
    try:
        realtime = await measure(duplex, "realtime", args)
        legacy = await measure(older, "legacy", args)
    finally:
        duplex.stop()
        older.stop()

    print(f"machine: {os.cpu_count()} cores, Python {sys.version.split()[0]}")
    print(f"the duplex fake's first audio after {args.first_audio_delay * 1000:.0f} ms; the older fake's at once")
    for name, figures in (("/v1/realtime         ", realtime), ("/v1/video/chat/stream", legacy)):
        print(f"{name} response.create -> first transcript delta: {summary(figures.first_text_s)}")
        print(f"{name} response.create -> first voiced frame: {summary(figures.first_audio_s)}")
        print(f"{name} talker audio per response:        {summary(figures.speech_s)}")
        if figures.cancel_s:
            print(f"{name} response.cancel -> at the upstream:  {summary(figures.cancel_s)}")
        print(
            f"{name} gateway CPU-s/s per call: {figures.cpu_one:.3f} (1 call), "
            f"{figures.cpu_many / args.calls:.3f} ({args.calls} calls, {figures.cpu_many:.3f} in all)"
        )


if __name__ == "__main__":
    asyncio.run(main())
