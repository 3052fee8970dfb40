"""The headless client's camera sends what the session samples: camera_send_fps(sample_fps) frames a
second, by pacing a synthetic camera or by dropping frames of any other source before encoding."""

from __future__ import annotations

import asyncio
import fractions

import av
import pytest
from aiortc.mediastreams import MediaStreamTrack, VideoStreamTrack

from rtc_omni.client.media import FrameRateCap, camera_send_fps
from rtc_omni.client.rtc_peers import UnderstandClient

from .conftest import ClientFactory, RunningServer

WINDOW_S = 3.0


def test_the_camera_sends_twice_the_sampling_rate_and_at_least_five_fps() -> None:
    assert [camera_send_fps(fps) for fps in (0.5, 2.0, 2.5, 4.0, 15.0)] == [5.0, 5.0, 5.0, 8.0, 30.0]


class ThirtyFpsSource(MediaStreamTrack):
    """Frames stamped 1/30 s apart in media time, as fast as they are asked for."""

    kind = "video"

    def __init__(self) -> None:
        super().__init__()
        self.index = 0

    async def recv(self) -> av.VideoFrame:
        frame = av.VideoFrame(16, 16, "yuv420p")
        frame.pts, frame.time_base = self.index * 3000, fractions.Fraction(1, 90_000)
        self.index += 1
        return frame


async def test_frame_rate_cap_passes_on_max_fps_of_its_sources_frames_by_media_time() -> None:
    source = ThirtyFpsSource()
    capped = FrameRateCap(source, max_fps=5.0)
    passed = [await capped.recv() for _ in range(15)]
    # 15 frames at 5 fps span 2.8 s of media time: 84 of the source's 1/30 s frames.
    assert source.index == 85 and [f.pts for f in passed] == [i * 18_000 for i in range(15)]
    capped.max_fps = None
    assert (await capped.recv()).pts == 85 * 3000  # no cap: every frame
    capped.stop()
    assert source.readyState == "ended"


async def frames_received_in_window(server: RunningServer, client: UnderstandClient) -> int:
    session = server.registry.get(client.session_id).session
    before = session.stats()["frames_received"]
    await asyncio.sleep(WINDOW_S)
    return session.stats()["frames_received"] - before


def at_most(fps: float) -> int:
    """Frames a sender at `fps` can deliver in the window, with room for a late burst: far below 30 fps."""
    return int(fps * WINDOW_S * 1.5) + 3


@pytest.mark.media
async def test_the_headless_camera_sends_the_rate_its_sessions_sample(
    server: RunningServer, make_client: ClientFactory
) -> None:
    synthetic = await make_client(server, colour="green", tone=None, moving=True, config={"sample_fps": 4})
    other = UnderstandClient(server.url, video=VideoStreamTrack(), audio=None, receive_audio=False)
    try:
        await other.connect()
        await other.configure()
        assert synthetic.camera is synthetic.video and isinstance(other.camera, FrameRateCap)
        received = await asyncio.gather(*(frames_received_in_window(server, c) for c in (synthetic, other)))
    finally:
        await other.close()
    # 8 fps (twice 4) from the synthetic camera, 5 fps (the least) from aiortc's 30 fps test track.
    assert 0 < received[0] <= at_most(8) and 0 < received[1] <= at_most(5) < 30 * WINDOW_S, received
