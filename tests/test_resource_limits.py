"""Cheap inputs that would cost the server a lot: images, generation sizes, recordings, upstream
messages. Each is bounded by a documented setting, refused with a clear error, and the session goes on."""

from __future__ import annotations

import asyncio
import base64
import io
from fractions import Fraction
from typing import Any

import av
from aiortc.mediastreams import MediaStreamError
from PIL import Image

from rtc_omni.media.images import fitted_size
from rtc_omni.media.ingest import ingest_video

from .conftest import ClientFactory, RunningServer, ServerFactory, WsFactory
from .wsclient import jpeg_b64

UNDERSTAND_WS = "/v1/video/chat/stream"


def one_bit_png_b64(side: int) -> str:
    """A tiny PNG that decodes huge: 9400x9400 is 11 KB on the wire and 265 MB as RGB."""
    out = io.BytesIO()
    Image.new("1", (side, side), 0).save(out, format="PNG", optimize=True)
    return base64.b64encode(out.getvalue()).decode("ascii")


async def test_a_png_bomb_over_the_websocket_gets_an_error_and_the_session_goes_on(
    server: RunningServer, make_ws: WsFactory
) -> None:
    client = await make_ws(server, UNDERSTAND_WS)
    await client.send({"type": "session.config"})
    await client.send({"type": "video.frame", "data": one_bit_png_b64(9400), "frame_id": "bomb"})
    error = await client.wait_event("error")
    assert "9400x9400" in error["message"] and str(3840 * 2160) in error["message"]
    await client.send({"type": "video.frame", "data": jpeg_b64((230, 20, 20)), "frame_id": "ok"})
    ack = await client.wait_event("video.frame.ack")
    assert ack["frame_id"] == "ok" and ack["accepted"] and ack["buffered_frames"] == 1
    mark = len(client.events)
    await client.send({"type": "video.query", "text": "What colour?"})
    delta = await client.wait_event("response.text.delta", after=mark, timeout=20)
    assert not client.closed.is_set() and delta["delta"]


async def test_the_image_cap_is_a_setting_and_applies_on_the_datachannel(
    make_server: ServerFactory, make_client: ClientFactory
) -> None:
    server = await make_server(max_image_pixels=200 * 200)
    client = await make_client(server, colour=None, tone=None, config={})
    client.send({"type": "video.frame", "data": jpeg_b64((20, 200, 40), (320, 240)), "frame_id": "big"})
    error = await client.wait_event("error")
    assert "320x240" in error["message"] and "40000 pixels" in error["message"]
    client.send({"type": "video.frame", "data": jpeg_b64((20, 200, 40), (200, 200)), "frame_id": "fits"})
    ack = await client.wait_event("video.frame.ack")
    assert ack["frame_id"] == "fits" and ack["accepted"]


class _FrameTrack:
    """A video track of `count` decoded frames of one size, as aiortc's decoder hands them over."""

    kind = "video"

    def __init__(self, width: int, height: int, count: int) -> None:
        self.frames = []
        for index in range(count):
            frame = av.VideoFrame(width, height, "yuv420p")
            frame.pts, frame.time_base = index * 3000, Fraction(1, 90_000)
            self.frames.append(frame)

    async def recv(self) -> av.VideoFrame:
        if not self.frames:
            raise MediaStreamError
        return self.frames.pop(0)


class _Sink:
    sample_fps = 30.0

    def __init__(self) -> None:
        self.sizes: list[tuple[int, int]] = []

    def note_frame_received(self) -> None:
        pass

    async def add_track_frame(self, image: Image.Image, pts_ms: Any, received_ts_ms: float) -> None:
        self.sizes.append(image.size)

    def add_track_audio(self, pcm16: bytes) -> None:
        pass


async def test_rtp_frames_over_the_cap_are_scaled_down_before_their_rgb_copy() -> None:
    sink = _Sink()
    await asyncio.wait_for(ingest_video(_FrameTrack(3840, 2160, 3), sink, 1280 * 720), 10)  # type: ignore[arg-type]
    assert sink.sizes == [(1280, 720)] * 3
    sink = _Sink()
    await asyncio.wait_for(ingest_video(_FrameTrack(640, 480, 2), sink, 1280 * 720), 10)  # type: ignore[arg-type]
    assert sink.sizes == [(640, 480)] * 2


def test_fitted_size_keeps_the_aspect_ratio_within_the_cap() -> None:
    assert fitted_size(16383, 16383, 3840 * 2160) == (2880, 2880)
    assert fitted_size(640, 480, 3840 * 2160) == (640, 480)
    for width, height, cap in [(9400, 10, 1000), (1921, 1081, 1920 * 1080), (10, 9400, 5000), (7, 5, 30)]:
        fitted_width, fitted_height = fitted_size(width, height, cap)
        assert fitted_width * fitted_height <= cap and fitted_width % 2 == 0 and fitted_height % 2 == 0
