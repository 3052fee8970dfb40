"""The outgoing track's fan-out (media/fanout.py) and the shared encoder's keyframe requests
(media/shared_encode.py), on in-memory tracks: no consumer misses a frame, however slow, and a
viewer's picture-loss report makes the next shared frame a keyframe."""

from __future__ import annotations

import asyncio
import fractions
from types import SimpleNamespace

import av
import numpy as np
import pytest
from aiortc import RTCRtpSender
from aiortc.mediastreams import MediaStreamError, MediaStreamTrack
from aiortc.rtp import RTCP_PSFB_PLI, RtcpPsfbPacket

from rtc_omni import metrics
from rtc_omni.media import fanout
from rtc_omni.media.fanout import TrackFanout
from rtc_omni.media.shared_encode import KEYFRAME_INTERVAL_S, SharedEncoder
from rtc_omni.patches.keyframes import forward_keyframe_requests

FPS = 24


class CountingVideoTrack(MediaStreamTrack):
    """Frames 0..count-1, as fast as they are asked for (pts = index at FPS), then the end."""

    kind = "video"

    def __init__(self, count: int) -> None:
        super().__init__()
        self.count = count
        self.sent = 0

    async def recv(self) -> av.VideoFrame:
        await asyncio.sleep(0.001)
        if self.sent >= self.count or self.readyState != "live":
            raise MediaStreamError
        frame = av.VideoFrame.from_ndarray(np.full((48, 64, 3), self.sent % 256, np.uint8), format="rgb24")
        frame.pts, frame.time_base = self.sent, fractions.Fraction(1, FPS)
        self.sent += 1
        return frame


async def read_all(track: MediaStreamTrack, seconds_per_frame: float = 0.0) -> list[int]:
    """pts of every frame `track` gives until it ends; sleeps after each like a slow encoder."""
    received: list[int] = []
    try:
        while True:
            frame = await track.recv()
            assert frame.pts is not None
            received.append(frame.pts)
            await asyncio.sleep(seconds_per_frame)
    except MediaStreamError:
        return received


async def test_every_consumer_gets_every_frame_while_one_encodes_slowly() -> None:
    # aiortc's MediaRelay(buffered=False) kept only the latest frame: the slow consumer lost most.
    source = CountingVideoTrack(60)
    relay = TrackFanout(source)
    fast, slow = relay.subscribe(), relay.subscribe()
    async with asyncio.timeout(10):
        got_fast, got_slow = await asyncio.gather(read_all(fast), read_all(slow, seconds_per_frame=0.01))
    assert got_fast == list(range(60)) and got_slow == list(range(60))


async def test_a_consumer_that_stops_reading_holds_the_others_back_only_briefly(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(fanout, "STALLED_S", 0.05)
    dropped = metrics.OUTGOING_FRAMES_DROPPED.labels("video")
    before = dropped._value.get()
    source = CountingVideoTrack(30)
    relay = TrackFanout(source)
    reader, stuck = relay.subscribe(), relay.subscribe()
    await stuck.recv()  # counted from now on, then never reads again
    async with asyncio.timeout(10):
        got = await read_all(reader)
    assert got == list(range(1, 30)) or got == list(range(30))
    assert dropped._value.get() - before >= 30 - 1 - fanout.QUEUE_FRAMES["video"] - 1
    relay.stop()
    with pytest.raises(MediaStreamError):
        for _ in range(fanout.QUEUE_FRAMES["video"] + 1):  # what was queued, then the end
            await stuck.recv()


async def test_a_viewers_picture_loss_report_makes_the_next_shared_frame_a_keyframe() -> None:
    encoder = SharedEncoder(CountingVideoTrack(FPS * 2), "video/vp8", on_idle=lambda: None)
    viewer = encoder.subscribe()
    # A real aiortc sender, as AttachedPeer builds it; only its RTCP handling runs here.
    sender = RTCRtpSender(viewer, SimpleNamespace(state="new"))  # type: ignore[arg-type]
    forward_keyframe_requests(sender, viewer.request_keyframe)
    packets: list[av.Packet] = []
    async with asyncio.timeout(10):
        while len(packets) < 6:
            packets.append(await viewer.recv())
        await sender._handle_rtcp_packet(RtcpPsfbPacket(fmt=RTCP_PSFB_PLI, ssrc=1, media_ssrc=sender._ssrc))
        while len(packets) < FPS * KEYFRAME_INTERVAL_S:
            packets.append(await viewer.recv())
    keyframes = [i for i, packet in enumerate(packets) if packet.is_keyframe]
    assert keyframes[0] == 0 and 6 <= keyframes[1] < FPS * KEYFRAME_INTERVAL_S, keyframes
    encoder.stop()
