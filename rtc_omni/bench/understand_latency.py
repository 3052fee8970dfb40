"""One understanding session at a time: connect, ingest, talker audio out, interrupt."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass

from ..client.media import ColourVideoTrack, ToneAudioTrack
from ..client.rtc_peers import UnderstandClient
from .common import ack_latencies, silent_from

CAMERA = (640, 480, 30)
SAMPLE_FPS = 10.0


def camera() -> ColourVideoTrack:
    """The benchmark's camera: 640x480@30 with a moving block, so every frame differs."""
    width, height, fps = CAMERA
    return ColourVideoTrack((40, 90, 200), width, height, fps, moving=True)


@dataclass
class ConnectFigures:
    connected_s: list[float]  # offer created -> peer connected with the DataChannel open
    first_ack_s: list[float]  # offer created -> first `video.frame.ack` received


async def measure_connect(url: str, count: int) -> ConnectFigures:
    figures = ConnectFigures([], [])
    for _ in range(count):
        client = UnderstandClient(url, video=camera(), audio=ToneAudioTrack())
        started = time.monotonic()
        try:
            await client.connect()
            await client.configure(sample_fps=SAMPLE_FPS, enable_frame_filter=False)
            ack = await client.wait_event("video.frame.ack")
            figures.connected_s.append(client.connect_seconds or 0.0)
            figures.first_ack_s.append(client.event_times[client.events.index(ack)] - started)
        finally:
            await client.close()
    return figures


@dataclass
class IngestFigures:
    ack_s: list[float]  # RTP frame sent -> its `video.frame.ack` received
    payload_bytes_per_s: float  # RTP payload sent, video + audio (aiortc's outbound `bytesSent`)


async def _rtp_bytes_sent(client: UnderstandClient) -> int:
    report = await client.pc.getStats()
    return sum(s.bytesSent for s in report.values() if s.type == "outbound-rtp")


async def measure_ingest(url: str, codec: str, seconds: float) -> IngestFigures:
    """Camera + mic in, frames sampled at 10 fps and acked."""
    video = camera()
    client = UnderstandClient(url, video=video, audio=ToneAudioTrack(), video_codec=codec)
    try:
        await client.connect()
        await client.configure(sample_fps=SAMPLE_FPS, enable_frame_filter=False)
        await asyncio.sleep(1.0)  # past the first keyframe
        bytes0, t0 = await _rtp_bytes_sent(client), time.monotonic()
        await asyncio.sleep(seconds)
        rate = (await _rtp_bytes_sent(client) - bytes0) / (time.monotonic() - t0)
        return IngestFigures(ack_latencies(client, video), rate)
    finally:
        await client.close()


async def _wait_voiced(client: UnderstandClient, since: float, frames: int = 1, timeout: float = 10.0) -> float:
    """Arrival time of the first of `frames` voiced talker frames after `since`."""
    assert client.recorder is not None
    async with asyncio.timeout(timeout):
        while client.recorder.voiced_frames(since=since) < frames:
            await asyncio.sleep(0.005)
    return next(f.at for f in client.recorder.frames if f.at >= since and f.rms >= client.recorder.SILENCE_RMS)


async def _quiet_client(url: str, **config: object) -> UnderstandClient:
    """A small camera, no mic: what is measured is the talker's way out, not ingest."""
    client = UnderstandClient(url, video=ColourVideoTrack((200, 30, 30), 320, 240, 15), audio=None)
    await client.connect()
    await client.configure(**config)
    await client.wait_event("video.frame.ack")
    return client


async def _cancel_turn(client: UnderstandClient) -> None:
    """Stop the turn with `response.cancel` and wait until the talker is silent: the next round starts
    from silence without waiting for a whole answer to play out."""
    mark, sent = len(client.events), time.monotonic()
    client.send({"type": "response.cancel"})
    await client.wait_event(where=lambda e: e["type"] in ("response.cancelled", "error"), after=mark)
    assert client.recorder is not None
    async with asyncio.timeout(5):
        while silent_from(client.recorder, sent) is None:
            await asyncio.sleep(0.02)


async def measure_audio_out(url: str, turns: int) -> list[float]:
    """Engine audio chunk -> its first audio decoded at the peer.

    With `audio_events` the session sends `response.audio.delta` when the engine yields a chunk,
    before writing it to the talker track; the first delta's arrival (one DataChannel hop after the
    yield) to the first voiced talker frame decoded at the peer is the figure.
    """
    client = await _quiet_client(url, audio_events=True)
    results = []
    try:
        for i in range(turns):
            mark = len(client.events)
            client.send({"type": "video.query", "text": f"what do you see {i}"})
            delta = await client.wait_event("response.audio.delta", after=mark, timeout=30)
            yielded = client.event_times[client.events.index(delta, mark)]
            results.append(await _wait_voiced(client, since=yielded - 0.001) - yielded)
            await _cancel_turn(client)
    finally:
        await client.close()
    return results


async def measure_interrupt(url: str, count: int) -> list[float]:
    """Interrupting `video.query` sent -> the talker audio received at the peer going silent."""
    client = await _quiet_client(url)
    results = []
    try:
        for i in range(count):
            mark = len(client.events)
            client.send({"type": "video.query", "text": f"tell me about it {i}"})
            await client.wait_event("response.start", after=mark)
            await _wait_voiced(client, since=time.monotonic(), frames=2)
            await asyncio.sleep(0.3)  # well into the answer
            mark = len(client.events)
            sent = time.monotonic()
            client.send({"type": "video.query", "text": "stop"})
            await client.wait_event("response.cancelled", after=mark)
            await asyncio.sleep(0.25)
            assert client.recorder is not None
            quiet = silent_from(client.recorder, sent)
            if quiet is not None:
                results.append(quiet - sent)
            await client.wait_event("response.start", after=mark)
            await _cancel_turn(client)  # the interrupting turn
    finally:
        await client.close()
    return results
