"""Benchmark session resume (docs/resume.md): what a network change costs the user, and what keeping a
session resumable costs the server.

`rtc-omni serve` (synthetic engine, tone voice) runs in a subprocess; the clients run here. Each round
asks a question and loses the connection while the answer plays:
  - WebRTC (an aiortc UnderstandClient with a camera and a microphone): one second into the spoken
    answer the client's network is cut (its ICE sockets go silent, no DTLS close), and it resumes at
    once on a new peer connection, as the page does when it notices. Printed: `resume()` (offer,
    answer, ICE, DTLS, the DataChannel open) and the silence the user hears: the last voiced frame
    decoded on the old connection -> the first on the new one, and the cut -> that frame (p50/p95);
    and the speech sent again (`talker_rewound_ms`: what the lost connection was sent after the peer
    was last heard from, some of which the user may hear twice).
  - WebSocket (/v1/realtime, raw JSON): the socket is dropped after the first audio delta and a new one
    sends session.resume. Printed: connect -> `session.resumed`, and -> the first replayed event.
  - The journal each kind of session holds after its answer (the `journal_bytes` stat).

Usage: python benchmarks/resume.py [--rounds 10]
Run it inside a loopback-only network namespace, like the tests.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from typing import Any

import aiohttp

from rtc_omni.bench.common import server, summary
from rtc_omni.client.media import COLOURS, ColourVideoTrack, ToneAudioTrack
from rtc_omni.client.rtc_peers import UnderstandClient
from tests.test_resume_rtc import cut_network
from tests.wsclient import WsClient

TOKEN = "bench-resume-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
QUESTION = {"type": "video.query", "text": "What do you see and hear?"}


async def journal_bytes(url: str, session_id: str) -> int:
    async with aiohttp.ClientSession(headers=AUTH) as http:
        async with http.get(f"{url}/v1/rtc/sessions/{session_id}") as answer:
            return int((await answer.json())["journal_bytes"])


async def webrtc_round(url: str, results: dict[str, list[float]]) -> None:
    video = ColourVideoTrack(COLOURS["red"], 320, 240, 15)
    client = UnderstandClient(url, video=video, audio=ToneAudioTrack(440.0), token=TOKEN)
    await client.connect()
    try:
        client.send({"type": "session.config", "model": "synthetic"})
        await client.wait_event("video.frame.ack", timeout=10)
        mark = len(client.events)
        client.send(QUESTION)
        recorder = client.recorder
        assert recorder is not None
        await client.wait_event("response.start", after=mark, timeout=15)
        async with asyncio.timeout(15):
            while recorder.voiced_frames() < 50:  # one second heard
                await asyncio.sleep(0.01)
        cut_network(client.pc)
        cut_at = time.monotonic()
        started = time.monotonic()
        await client.resume()
        results["webrtc resume()"].append(time.monotonic() - started)
        async with asyncio.timeout(15):
            while not recorder.voiced_frames(since=cut_at):
                await asyncio.sleep(0.005)
        before = [f.at for f in recorder.frames if f.at < cut_at and f.rms >= recorder.SILENCE_RMS]
        after = [f.at for f in recorder.frames if f.at >= cut_at and f.rms >= recorder.SILENCE_RMS]
        results["webrtc silence heard"].append(after[0] - before[-1])
        results["webrtc cut -> first voiced frame"].append(after[0] - cut_at)
        await client.wait_event("response.audio.done", after=mark, timeout=30)
        stats = await client_stats(url, client)
        results["webrtc sent again"].append(stats["talker_rewound_ms"] / 1000)
        results["webrtc journal KiB"].append(stats["journal_bytes"] / 1024)
    finally:
        await client.close()


async def client_stats(url: str, client: UnderstandClient) -> dict[str, Any]:
    async with aiohttp.ClientSession(headers=AUTH) as http:
        async with http.get(f"{url}/v1/rtc/sessions/{client.session_id}") as answer:
            return dict(await answer.json())


async def websocket_round(url: str, results: dict[str, list[float]]) -> None:
    ws_url = url.replace("http", "ws") + "/v1/realtime?model=synthetic"
    first = await WsClient.connect(ws_url, headers=AUTH)
    try:
        created = await first.wait_event("session.created")
        item = {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Hello?"}]}
        await first.send({"type": "conversation.item.create", "item": item})
        await first.send({"type": "response.create"})
        await first.wait_event("response.output_audio.delta")
        first.vanish()
        started = time.monotonic()
        token, seq = created["resume_token"], first.last_seq
        second = await WsClient.resume(ws_url, created["session_id"], token, seq, headers=AUTH)
        try:
            await second.wait_event("session.resumed")
            results["websocket resumed"].append(time.monotonic() - started)
            await second.wait_event(where=lambda e: "server_event_seq" in e)
            results["websocket first replayed"].append(time.monotonic() - started)
            await second.wait_event("response.done", timeout=60)
            results["websocket journal KiB"].append(await journal_bytes(url, created["session_id"]) / 1024)
        finally:
            await second.close()
    finally:
        await first.close()


async def run(rounds: int) -> None:
    results: dict[str, list[float]] = {
        name: []
        for name in (
            "webrtc resume()",
            "webrtc silence heard",
            "webrtc cut -> first voiced frame",
            "webrtc sent again",
            "webrtc journal KiB",
            "websocket resumed",
            "websocket first replayed",
            "websocket journal KiB",
        )
    }
    with server(["--auth-token", TOKEN]) as (_process, url):
        for _ in range(rounds):
            await webrtc_round(url, results)
            await websocket_round(url, results)
    for name, values in results.items():
        if name.endswith("KiB"):
            print(f"{name}: {json.dumps([round(v, 1) for v in values])}")
        else:
            print(f"{name}: {summary(values)}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=10)
    asyncio.run(run(parser.parse_args().rounds))


if __name__ == "__main__":
    main()
