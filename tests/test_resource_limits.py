"""Cheap inputs that would cost the server a lot: images, generation sizes, recordings, upstream
messages. Each is bounded by a documented setting, refused with a clear error, and the session goes on."""

from __future__ import annotations

import asyncio
import base64
import io
import json
from collections.abc import Callable
from fractions import Fraction
from pathlib import Path
from typing import Any

import aiohttp
import av
import numpy as np
import pytest
import simplejpeg
from aiortc.mediastreams import MediaStreamError
from PIL import Image
from yarl import URL

from rtc_omni.config import Settings
from rtc_omni.engines import create_engines
from rtc_omni.engines.engine import EngineError, GenerateRequest, TurnFrame, UnderstandTurn
from rtc_omni.media.images import fitted_size
from rtc_omni.media.ingest import ingest_video
from rtc_omni.media.recorder import Mp4Recorder
from rtc_omni.protocol import generate_messages as generate_proto
from rtc_omni.protocol import understand_messages as understand_proto
from rtc_omni.sessions.recordings import RecordingsFull, RecordingStore

from .conftest import FAST_SETTINGS, ClientFactory, RunningServer, ServerFactory, WsFactory
from .upstreams import scripted_upstream
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
    assert "9400x9400" in error["message"] and str(1920 * 1080) in error["message"]
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

    async def add_track_frame(self, frame: av.VideoFrame, pts_ms: Any, received_ts_ms: float) -> None:
        self.sizes.append((frame.width, frame.height))

    def add_track_audio(self, pcm16: bytes) -> None:
        pass


async def test_rtp_frames_over_the_cap_are_scaled_down_before_their_jpeg() -> None:
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


GENERATE_WS = "/v1/realtime/video"
OVERSIZED_STARTS = [
    ({"size": "100000x100000"}, "100000x100000 has a side over 16383"),
    ({"size": "3000x3000"}, "3000x3000 is over this server's 2073600 pixels per frame (--max-video-pixels)"),
    ({"width": 2000, "height": 2000}, "2000x2000 is over"),
    ({"fps": 100000}, "fps 100000 is over this server's 60 (--max-video-fps)"),
    ({"num_frames": 10**9}, "num_frames 1000000000 is over this server's 14400 (--max-video-frames)"),
    ({"seconds": "100000"}, "num_frames 2400000 is over"),
]


async def test_oversized_generations_are_refused_and_the_datachannel_session_goes_on(
    make_server: ServerFactory,
) -> None:
    from rtc_omni.client.rtc_peers import GenerateClient

    server = await make_server(synthetic_chunk_frames=5, synthetic_first_chunk_latency=0.05)
    client = GenerateClient(server.url)
    await client.connect()
    try:
        for fields, expected in OVERSIZED_STARTS:
            mark = len(client.events)
            client.send({"type": "session.start", "prompt": "x", **fields})
            error = await client.wait_event("error", after=mark)
            assert error["message"].startswith("Invalid session.start: ") and expected in error["message"], error
        start = await client.start(prompt="ok", size="160x128", fps=30, num_frames=5)
        assert start["config"]["size"] == "160x128"
        done = await client.wait_event("session.done", timeout=20)
        assert done["frames"] == 5
    finally:
        await client.close()


async def test_a_deployment_raises_the_generation_limits_with_settings(
    make_server: ServerFactory, make_ws: WsFactory
) -> None:
    server = await make_server(
        max_video_pixels=4000 * 4000, max_video_fps=120, max_video_frames=3, synthetic_chunk_frames=3
    )
    client = await make_ws(server, GENERATE_WS)
    await client.send({"type": "session.start", "prompt": "x", "size": "3000x3000", "fps": 120, "num_frames": 4})
    error = await client.wait_event("error")
    assert "num_frames 4 is over this server's 3" in error["message"]
    client = await make_ws(server, GENERATE_WS)
    await client.send({"type": "session.start", "prompt": "x", "size": "48x32", "fps": 120, "num_frames": 3})
    assert (await client.wait_event("video.start"))["config"]["fps"] == 120


def noise_frame(seed: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, (240, 320, 3), dtype=np.uint8)


async def test_a_recording_stops_at_its_byte_cap_and_stays_playable(tmp_path: Path) -> None:
    recorder = Mp4Recorder(tmp_path / "capped.mp4", 30, max_bytes=1024 * 1024)
    for index in range(60):
        await recorder.write(noise_frame(index))
    await recorder.finish()
    size = recorder.path.stat().st_size
    assert recorder.full and 1024 * 1024 <= size < 2 * 1024 * 1024
    with av.open(str(recorder.path)) as container:
        assert 0 < len(list(container.decode(video=0))) == recorder.frames < 60


async def test_eviction_takes_the_oldest_finished_recording_never_one_in_progress(tmp_path: Path) -> None:
    store = RecordingStore(str(tmp_path), max_recordings=2, max_bytes=1024 * 1024)
    first, second = store.reserve("first", 30), store.reserve("second", 30)
    for recorder in (first, second):
        await recorder.write(noise_frame(0))
    with pytest.raises(RecordingsFull, match="2 are being written"):
        store.reserve("third", 30)
    assert first.path.is_file() and second.path.is_file() and store.in_progress("first")
    await second.finish()
    third = store.reserve("third", 30)  # the only finished one goes, though it is the newer
    assert not second.path.exists() and store.get("second") is None
    assert first.path.is_file() and store.in_progress("first") and store.get("first") is None
    await first.finish()
    await third.finish()
    assert store.get("first") == first.path and store.get("third") is None  # third recorded no frame


async def test_a_websocket_generation_reports_where_its_recording_is_fetched(
    make_server: ServerFactory, make_ws: WsFactory
) -> None:
    server = await make_server(synthetic_chunk_frames=6, synthetic_first_chunk_latency=0.05)
    client = await make_ws(server, GENERATE_WS)
    start = {"type": "session.start", "prompt": "x", "size": "64x48", "fps": 30, "num_frames": 12, "record": True}
    await client.send(start)
    done = await client.wait_event("session.done", timeout=20)
    where = URL(done["recording"])
    assert where.path.startswith("/v1/rtc/sessions/") and where.path.endswith("/recording")
    assert where.query["access_token"]  # the session's view token: the socket's client holds no other
    async with aiohttp.ClientSession() as http:
        async with http.get(server.url + done["recording"]) as response:
            assert response.status == 200 and response.content_type == "video/mp4"
            body = await response.read()
    with av.open(io.BytesIO(body)) as container:
        assert len(list(container.decode(video=0))) == done["frames"] == 12


def _after_the_request(reply: str) -> Callable[[dict[str, Any]], list[Any]]:
    """A hostile upstream's answer to a query (after the turn's `response.start`) or a generation's
    start: one text message, `reply`."""

    def answer(message: dict[str, Any]) -> list[Any]:
        if message["type"] == "video.query":
            return [{"type": "response.start", "request_id": "r"}, reply]
        return [reply] if message["type"] == "session.start" else []

    return answer


async def engine_error_from(path: str, reply: str, request: UnderstandTurn | GenerateRequest, match: str) -> None:
    """Run `request` through a gateway whose one upstream answers `reply`: it must fail with `match`."""
    async with scripted_upstream(path, _after_the_request(reply)) as url:
        settings = Settings(**{**FAST_SETTINGS, "engine": "remote", "upstream": [url], "upstream_health_interval": 0})
        engines = await create_engines(settings)
        assert engines.understand is not None and engines.generate is not None
        try:
            with pytest.raises(EngineError, match=match):
                if isinstance(request, UnderstandTurn):
                    async for _output in engines.understand.generate(request):
                        pass
                else:
                    async for _chunk in engines.generate.generate(request):
                        pass
        finally:
            await engines.close()


async def test_a_hostile_upstreams_oversized_messages_fail_the_request_not_the_gateway() -> None:
    frame = TurnFrame(frame_id=None, pts_ms=None, jpeg=simplejpeg.encode_jpeg(np.zeros((48, 64, 3), np.uint8)))
    turn = UnderstandTurn(request_id="t", frames=[frame], audio_pcm16=b"", query="hi")
    huge_delta = json.dumps({"type": "response.text.delta", "delta": "x" * 8_000_000})
    await engine_error_from(understand_proto.WEBSOCKET_PATH, huge_delta, turn, f"over {4 * 1024 * 1024} bytes")

    long_answer = json.dumps({"type": "response.text.delta", "delta": "x" * 3_000_000})
    await engine_error_from(
        understand_proto.WEBSOCKET_PATH, long_answer, turn, f"answered over {1024 * 1024} characters"
    )

    big_event = json.dumps({"type": "video.chunk_metadata", "padding": "x" * 2_000_000})
    request = GenerateRequest(request_id="g", prompt="x", width=64, height=48, num_frames=4, fps=8)
    await engine_error_from(generate_proto.WEBSOCKET_PATH, big_event, request, f"event \\(at most {1024 * 1024}\\)")


async def test_a_recording_over_its_byte_cap_is_reported_and_the_generation_goes_on(
    make_server: ServerFactory, make_ws: WsFactory
) -> None:
    server = await make_server(max_recording_bytes=64 * 1024, synthetic_chunk_frames=20)
    client = await make_ws(server, GENERATE_WS)
    start = {"type": "session.start", "prompt": "x", "size": "640x480", "fps": 30, "num_frames": 80, "record": True}
    await client.send(start)
    error = await client.wait_event("error", timeout=60)
    assert error["message"].startswith("recording stopped at 65536 bytes (--max-recording-bytes)")
    done = await client.wait_event("session.done", timeout=60)
    assert done["frames"] == 80 and not done["stopped"]
    async with aiohttp.ClientSession() as http:
        async with http.get(server.url + done["recording"]) as response:
            assert response.status == 200
            body = await response.read()
    with av.open(io.BytesIO(body)) as container:
        assert 0 < len(list(container.decode(video=0))) < 80


async def test_an_event_too_large_for_the_datachannel_becomes_an_error_and_the_session_goes_on(
    server: RunningServer, make_client: ClientFactory
) -> None:
    client = await make_client(server, colour="red", tone=None, config={})
    await client.wait_event("video.frame.ack")
    # 100 KB as UTF-8; echoed by the synthetic engine, the server's event escapes it to 6 bytes a character
    client.send(json.dumps({"type": "video.query", "text": "Ñ" * 50_000}, ensure_ascii=False))
    error = await client.wait_event("error", timeout=30)
    assert "bytes was dropped: larger than one DataChannel message may be" in error["message"]
    result = await client.ask("What colour?", timeout=30)
    assert "mostly red" in result.text
