"""The generated-video track's pacing: the requested rate holds when the sender runs late, and the
clock re-bases (no burst) when the engine does."""

from __future__ import annotations

import asyncio
import time
import types

import numpy as np
import pytest

from rtc_omni.media import video_out
from rtc_omni.media.video_out import VIDEO_CLOCK_RATE, GeneratedVideoTrack

FPS = 20.0


def frame() -> np.ndarray:
    return np.zeros((16, 16, 3), np.uint8)


class FrameClock:
    """Stands in for the track's wall clock, so that a test of its pacing does not depend on how busy
    the machine is: `monotonic` reads it, and the track's sleeps advance it (and are recorded)."""

    def __init__(self) -> None:
        self.now = 1000.0
        self.sleeps: list[float] = []

    def monotonic(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds
        await asyncio.sleep(0)


def use_clock(monkeypatch: pytest.MonkeyPatch, clock: FrameClock) -> None:
    monkeypatch.setattr(video_out, "time", types.SimpleNamespace(monotonic=clock.monotonic))
    monkeypatch.setattr(video_out, "asyncio", types.SimpleNamespace(**{**vars(asyncio), "sleep": clock.sleep}))


async def test_a_late_sender_catches_up_on_frames_that_were_ready(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = FrameClock()
    use_clock(monkeypatch, clock)
    track = GeneratedVideoTrack()
    track.fps = FPS
    for _ in range(6):
        await track.put(frame())
    first = await track.recv()
    clock.now += 0.2  # a busy event loop: four frames' time passes with the frames already queued
    rest = [await track.recv() for _ in range(5)]
    track.stop()

    assert track.rebases == 0
    assert [f.pts for f in [first, *rest]] == [round(n * VIDEO_CLOCK_RATE / FPS) for n in range(6)]
    # Frames 1-4 were overdue and went at once; only frame 5 waited, for the rest of its interval.
    assert clock.sleeps == [pytest.approx(1 / FPS)]


async def test_a_late_engine_re_bases_the_clock_instead_of_bursting() -> None:
    track = GeneratedVideoTrack()
    track.fps = FPS
    await track.put(frame())
    await track.recv()
    time.sleep(0.2)  # the engine is late: the next frame arrives after its time
    await track.put(frame())
    await track.put(frame())
    second = await track.recv()
    started = time.monotonic()
    third = await track.recv()
    track.stop()

    assert track.rebases == 1
    assert third.pts - second.pts == round(VIDEO_CLOCK_RATE / FPS)
    assert time.monotonic() - started > 0.8 / FPS  # the third frame kept the pace from the second


async def test_a_parked_track_holds_its_frames_until_unparked() -> None:
    track = GeneratedVideoTrack()
    track.fps = FPS
    await track.put(frame())
    track.park()
    with pytest.raises(TimeoutError):
        async with asyncio.timeout(0.2):
            await track.recv()
    track.unpark()
    await track.recv()
    assert track.frames_sent == 1 and track.backlog == 0
    track.stop()
