"""vLLM-Omni's WebSocket way of feeding the same session, same content and rate: the baseline
that shows what WebRTC's media path saves (bytes) and costs (latency).

A reference client sends each sampled camera frame as a base64 JPEG `video.frame` and the mic as
base64 PCM16 16 kHz `audio.chunk` messages over `WS /v1/video/chat/stream`; the server's session
code is the one the WebRTC path uses.
"""

from __future__ import annotations

import asyncio
import base64
import io
import json
import time
from dataclasses import dataclass
from typing import Any

import aiohttp
import numpy as np
from PIL import Image

from ..pcm import INPUT_SAMPLE_RATE
from .understand_latency import SAMPLE_FPS, camera

JPEG_QUALITY = 80  # a browser's canvas.toDataURL("image/jpeg") default is 0.92; clients often lower it
AUDIO_CHUNK_S = 0.1


@dataclass
class WebSocketFigures:
    ack_s: list[float]  # `video.frame` sent -> its `video.frame.ack` received
    payload_bytes_per_s: float  # WebSocket message bytes sent, frames + audio


def _jpeg_b64(image: np.ndarray) -> str:
    out = io.BytesIO()
    Image.fromarray(image).save(out, format="JPEG", quality=JPEG_QUALITY)
    return base64.b64encode(out.getvalue()).decode("ascii")


def _tone_b64(start: int, samples: int, hz: float = 440.0) -> str:
    t = (start + np.arange(samples)) / INPUT_SAMPLE_RATE
    return base64.b64encode((0.3 * np.sin(2 * np.pi * hz * t) * 32767).astype("<i2").tobytes()).decode("ascii")


async def measure_websocket_ingest(url: str, seconds: float) -> WebSocketFigures:
    ws_url = url.replace("http", "ws", 1) + "/v1/video/chat/stream"
    video = camera()
    sent_at: dict[str, float] = {}
    acks: list[float] = []
    sent_bytes = 0

    async def send(ws: aiohttp.ClientWebSocketResponse, message: dict[str, Any]) -> None:
        nonlocal sent_bytes
        text = json.dumps(message)
        sent_bytes += len(text.encode())
        await ws.send_str(text)

    async def read(ws: aiohttp.ClientWebSocketResponse) -> None:
        async for message in ws:
            if message.type == aiohttp.WSMsgType.TEXT:
                event = json.loads(message.data)
                if event.get("type") == "video.frame.ack" and event.get("frame_id") in sent_at:
                    acks.append(time.monotonic() - sent_at[event["frame_id"]])

    async with aiohttp.ClientSession() as http, http.ws_connect(ws_url) as ws:
        reader = asyncio.ensure_future(read(ws))
        await send(ws, {"type": "session.config", "enable_frame_filter": False, "modalities": ["text"]})
        started = time.monotonic()
        frame_period, audio_samples = 1 / SAMPLE_FPS, int(AUDIO_CHUNK_S * INPUT_SAMPLE_RATE)
        frames = chunks = 0
        while (now := time.monotonic() - started) < seconds:
            if now >= frames * frame_period:
                video.frames_sent = int(frames * video.fps / SAMPLE_FPS)  # the camera frame this sample shows
                frame_id = f"f{frames}"
                message = {"type": "video.frame", "data": _jpeg_b64(video.image()), "frame_id": frame_id}
                sent_at[frame_id] = time.monotonic()  # JPEG encoding is the client's, before the send
                await send(ws, message)
                frames += 1
            if now >= chunks * AUDIO_CHUNK_S:
                await send(ws, {"type": "audio.chunk", "data": _tone_b64(chunks * audio_samples, audio_samples)})
                chunks += 1
            await asyncio.sleep(0.005)
        rate = sent_bytes / (time.monotonic() - started)
        await asyncio.sleep(0.3)  # the last acks
        reader.cancel()
        await asyncio.gather(reader, return_exceptions=True)
    return WebSocketFigures(acks[5:], rate)
