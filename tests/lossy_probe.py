"""What a user notices on a lossy network: a generation watched by its creator and a WHEP viewer,
one spoken understanding turn, and a WHIP publisher asked about by a controller, through a
namespace that drops UDP datagrams (tests/lossy.py).

    python -m tests.lossy_probe --loss 2 --delay-ms 30 --jitter-ms 10   # 2 % loss, 30±10 ms delay
    python -m tests.lossy_probe --outage 0.5         # every datagram lost for 0.5 s, twice

It creates its own namespace, runs itself inside it (server and peers in one process, on
127.0.0.1) and prints the figures as JSON. tests/test_lossy_network.py asserts on them and
docs/benchmarks.md publishes them.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from aiohttp.test_utils import TestServer
from aiortc import RTCSessionDescription

from rtc_omni.app import create_app
from rtc_omni.client.media import COLOURS, ColourVideoTrack, ReceivedVideoFrame, ToneAudioTrack
from rtc_omni.client.rtc_peers import GenerateClient, UnderstandClient
from rtc_omni.config import Settings
from rtc_omni.engines import Engines, create_engines

from .conftest import FAST_SETTINGS, RunningServer, ShortSpeechEngine
from .generate_client import received_through
from .lossy import delay_datagrams, lossy_namespace, outage, set_random_loss
from .whep_player import WhepPlayer, viewing
from .whip_client import SDP, http_raw, publisher_offer

ROOT = Path(__file__).resolve().parent.parent
FRAMES, FPS, SIZE = 96, 24, "416x240"
OUTAGE_AFTER_FRAMES = (24, 60)  # the generation's outages start once the creator has these frames


def video_figures(frames: list[ReceivedVideoFrame], outages_ended: list[float]) -> dict[str, Any]:
    indices = [f.index for f in frames]
    arrivals = [f.at for f in frames]
    freezes = [b - a for a, b in zip(arrivals, arrivals[1:])]
    recoveries = [min((at for at in arrivals if at >= end), default=float("inf")) - end for end in outages_ended]
    return {
        "received": len(indices),
        "missing": sorted(set(range(FRAMES)) - set(indices)),
        "in_order": indices == sorted(set(indices)),
        "longest_freeze_s": round(max(freezes, default=0.0), 3),
        "recovered_after_s": [round(r, 3) for r in recoveries],
    }


async def network_outage(namespace: str, seconds: float, ended: list[float]) -> None:
    outage(namespace, True)
    try:
        await asyncio.sleep(seconds)
    finally:
        outage(namespace, False)
        ended.append(time.monotonic())


async def generation(server: RunningServer, namespace: str, outage_s: float) -> dict[str, Any]:
    creator = GenerateClient(server.url, video_codec="vp8")
    viewer = WhepPlayer("video", "video/vp8")
    ended: list[float] = []
    try:
        await creator.connect()
        assert creator.session_id is not None
        await viewer.play(server, creator.session_id, viewing(creator))
        await creator.start(prompt="a red square", fps=FPS, num_frames=FRAMES, size=SIZE)
        for after in OUTAGE_AFTER_FRAMES if outage_s else ():
            async with asyncio.timeout(30):
                while creator.receiver is None or len(creator.receiver.frames) < after:
                    await asyncio.sleep(0.01)
            await network_outage(namespace, outage_s, ended)
        await creator.wait_event("session.done", timeout=60)
        return {
            "creator": video_figures(await received_through(creator.receiver, FRAMES - 1, 5), ended),
            "whep_viewer": video_figures(await received_through(viewer.video, FRAMES - 1, 5), ended),
        }
    finally:
        await viewer.close()
        await creator.close()


async def understanding_turn(server: RunningServer, namespace: str, outage_s: float) -> dict[str, Any]:
    camera = ColourVideoTrack(COLOURS["red"], 320, 240, 30)
    client = UnderstandClient(server.url, video=camera, audio=ToneAudioTrack(440.0))
    try:
        await client.connect()
        await client.configure()
        await client.wait_event("video.frame.ack", timeout=20)
        await asyncio.sleep(1.5)  # let the microphone fill the audio buffer
        peer = server.registry.get(client.session_id)
        talker = peer.outgoing
        voiced_before = talker.voiced_ms_sent
        ended: list[float] = []
        if outage_s:  # the network goes while the answer is being spoken
            asyncio.get_running_loop().call_later(
                0.5, lambda: asyncio.ensure_future(network_outage(namespace, outage_s, ended))
            )
        result = await client.ask("What do you see and hear?", timeout=60)
        async with asyncio.timeout(30):  # the talker plays the answer out in real time
            while talker.speaking or (outage_s and not ended):
                await asyncio.sleep(0.05)
        await asyncio.sleep(0.5)
        assert client.recorder is not None
        heard = client.recorder.voiced_frames(result.sent_at) * 0.02
        spoken = (talker.voiced_ms_sent - voiced_before) / 1000
        return {
            "answer": result.text[:300],
            "errors": result.errors,
            "time_to_first_text_s": round(result.time_to_first_text or float("inf"), 3),
            "talker_spoken_s": round(spoken, 2),
            "talker_heard_s": round(heard, 2),
        }
    finally:
        await client.close()


async def whip_publishing(server: RunningServer, namespace: str, outage_s: float) -> dict[str, Any]:
    """An OBS-like WHIP publisher (red camera, 440 Hz tone) and a controller's question about it."""
    pc, offer = await publisher_offer()
    controller: UnderstandClient | None = None
    try:
        status, headers, answer = await http_raw(server, "POST", "/whip", data=offer, headers=SDP)
        assert status == 201, answer
        await pc.setRemoteDescription(RTCSessionDescription(sdp=answer, type="answer"))
        session_id = headers["Location"].split("?")[0].rsplit("/", 1)[1]
        session = server.registry.get(session_id).session
        controller = UnderstandClient(server.url, video=None, audio=None, token=headers["Session-Token"])
        await controller.connect(kind="control", session_id=session_id)
        await controller.configure(modalities=["text"])  # the question is about the publisher, not the talker
        await controller.wait_event("video.frame.ack", timeout=20)
        frames_before, started = session.stats()["frames_received"], time.monotonic()
        if outage_s:
            await network_outage(namespace, outage_s, [])
        await asyncio.sleep(2.0)  # the publisher keeps sending; the tone fills the audio buffer
        result = await controller.ask("What do you see and hear?", timeout=60)
        frames = session.stats()["frames_received"] - frames_before
        return {
            "answer": result.text[:300],
            "errors": result.errors,
            "publisher_state": pc.connectionState,
            "frames_received_per_s": round(frames / (time.monotonic() - started), 1),
        }
    finally:
        if controller is not None:
            await controller.close()
        await pc.close()


async def measure_inside(namespace: str, outage_s: float, spoken_sentences: int | None = None) -> dict[str, Any]:
    """Run the probe's sessions against an in-process server; call inside the lossy namespace.
    `spoken_sentences` makes the talker speak only the answer's first sentences (tests/conftest.py)."""
    settings = Settings(
        **{**FAST_SETTINGS, "synthetic_chunk_frames": 24, "synthetic_first_chunk_latency": 0.3}  # type: ignore[arg-type]
    )
    engines = await create_engines(settings)
    if spoken_sentences is not None:
        engines = Engines(understand=ShortSpeechEngine(settings, spoken_sentences), generate=engines.generate)
    test_server = TestServer(create_app(settings, engines=engines), host="127.0.0.1", port=0)
    await test_server.start_server()
    try:
        server = RunningServer(test_server)
        return {
            "generation": await generation(server, namespace, outage_s),
            "understanding": await understanding_turn(server, namespace, outage_s),
            "whip": await whip_publishing(server, namespace, outage_s),
        }
    finally:
        await test_server.close()


def measure(
    loss_percent: int = 0,
    outage_s: float = 0.0,
    delay_ms: int = 0,
    jitter_ms: int = 0,
    spoken_sentences: int | None = None,
    timeout: float = 180.0,
) -> dict[str, Any]:
    """Make a lossy namespace, run the probe inside it, and return its figures."""
    with lossy_namespace() as namespace:
        set_random_loss(namespace, loss_percent)
        command = ["ip", "netns", "exec", namespace, sys.executable, "-m", "tests.lossy_probe", "--inside", namespace]
        if spoken_sentences is not None:
            command += ["--spoken-sentences", str(spoken_sentences)]
        environment = {**os.environ, "PYTHONPATH": str(ROOT)}
        done = subprocess.run(
            [*command, "--outage", str(outage_s), "--delay-ms", str(delay_ms), "--jitter-ms", str(jitter_ms)],
            cwd=ROOT,
            env=environment,
            capture_output=True,
            text=True,
            timeout=timeout,
        )
        if done.returncode != 0:
            raise RuntimeError(f"lossy probe failed ({done.returncode}):\n{done.stdout}\n{done.stderr[-4000:]}")
        figures = json.loads(done.stdout.strip().splitlines()[-1])
        network = {"loss_percent": loss_percent, "outage_s": outage_s, "delay_ms": delay_ms, "jitter_ms": jitter_ms}
        return {**network, **figures}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--loss", type=int, default=0, help="percent of UDP datagrams dropped at random")
    parser.add_argument("--outage", type=float, default=0.0, help="seconds of total UDP loss, twice per generation")
    parser.add_argument("--delay-ms", type=int, default=0, help="one-way delay of every datagram (tests/lossy.py)")
    parser.add_argument("--jitter-ms", type=int, default=0, help="± this much, uniform, around the delay")
    parser.add_argument("--spoken-sentences", type=int, help="the talker speaks only the answer's first N sentences")
    parser.add_argument("--inside", metavar="NAMESPACE", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.inside:
        if args.delay_ms or args.jitter_ms:
            delay_datagrams(args.delay_ms / 1000, args.jitter_ms / 1000)
        print(json.dumps(asyncio.run(measure_inside(args.inside, args.outage, args.spoken_sentences))))
    else:
        figures = measure(args.loss, args.outage, args.delay_ms, args.jitter_ms, args.spoken_sentences)
        print(json.dumps(figures, indent=2))


if __name__ == "__main__":
    main()
