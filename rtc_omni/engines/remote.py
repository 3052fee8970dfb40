"""The remote engine: an existing vLLM-Omni deployment (or another rtc-omni) as the model.

Each understanding turn opens a WebSocket to an upstream's `/v1/video/chat/stream`, replays the
turn as a reference client would (`session.config`, the sampled frames as `video.frame` JPEGs,
the audio as `audio.chunk`, `video.query`, then `video.done`) and maps the answer back: text
deltas to `TextDelta`, base64 WAV audio deltas to `AudioChunk`, ending at `session.done`. Ending
on `session.done` sidesteps the reference's done-event quirks (`response.text.done` before the last
delta, no done events without audio). An interrupt closes the socket, which aborts the upstream
request. Each generation opens `/v1/realtime/video`, forwards `session.start`, interactions and
stops, and decodes the fMP4 chunks into frames (media/fmp4.py).
"""

from __future__ import annotations

import asyncio
import base64
import io
import json
import wave
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import numpy as np
from aiohttp import WSCloseCode
from PIL import Image

from ..media.fmp4 import FragmentedMp4Decoder
from ..protocol import generate as generate_proto
from ..protocol import understand as understand_proto
from .base import (
    TALKER_SAMPLE_RATE,
    AudioChunk,
    ChunkEvents,
    EngineError,
    GenerateRequest,
    TextDelta,
    TurnFrame,
    UnderstandOutput,
    UnderstandTurn,
    VideoChunk,
)
from .upstream import Upstream, UpstreamPool

JPEG_QUALITY = 90
AUDIO_CHUNK_BYTES = 64 * 1024  # 2 s of 16 kHz PCM16 per audio.chunk message
INTERACTION_TIMEOUT_S = 5.0
AUDIO_DELTA_TYPES = ("response.audio.delta", "response.output_audio.delta")  # the latter: vLLM-Omni >= 0.30
NOT_SERVED = (understand_proto.NOT_AVAILABLE, generate_proto.NOT_AVAILABLE)
# What one upstream message may weigh, by kind, so a hostile or broken upstream costs at most this.
# A generation's fMP4 chunks may weigh the pool's default (upstream.DEFAULT_MAX_MESSAGE_BYTES).
UNDERSTAND_MESSAGE_BYTES = 4 * 1024 * 1024  # a text delta, or a WAV audio delta (~40 s of 24 kHz speech)
EVENT_BYTES = 1024 * 1024  # one JSON event of a generation, checked before it is parsed
MAX_ANSWER_CHARS = 1024 * 1024  # one turn's text, over all its deltas (a model's answer is a few KB)
INTERACTION_ERROR_CODES = ("event_id_conflict", "interaction_failed", "invalid_interaction")


async def _receive(
    pool: UpstreamPool, upstream: Upstream, ws: aiohttp.ClientWebSocketResponse, max_event_bytes: int
) -> dict[str, Any] | bytes:
    """The next event (parsed) or binary message; EngineError, and the upstream marked down, if it went
    away or sent a message over its size cap."""
    message = await ws.receive()
    if message.type == aiohttp.WSMsgType.TEXT:
        if len(message.data) > max_event_bytes:
            pool.mark_down(upstream)
            size = len(message.data)
            raise EngineError(f"upstream {upstream.url} sent a {size}-byte event (at most {max_event_bytes})")
        try:
            event = json.loads(message.data)
        except (ValueError, RecursionError) as exc:
            raise EngineError(f"upstream {upstream.url} sent a message that is not JSON") from exc
        if not isinstance(event, dict):
            raise EngineError(f"upstream {upstream.url} sent a non-object message")
        if event.get("type") == "error" and event.get("message") in NOT_SERVED:
            pool.mark_not_serving(upstream)  # one model per vLLM-Omni server: it serves the other endpoint
        return event
    if message.type == aiohttp.WSMsgType.BINARY:
        return bytes(message.data)
    pool.mark_down(upstream)
    if message.type == aiohttp.WSMsgType.ERROR and getattr(message.data, "code", None) == WSCloseCode.MESSAGE_TOO_BIG:
        raise EngineError(f"upstream {upstream.url} sent a message over {pool.max_message_bytes} bytes")
    raise EngineError(f"upstream {upstream.url} closed the connection mid-request")


def _jpeg_base64(frame: TurnFrame) -> str:
    """The frame's buffered JPEG as is (no second encode), or a fresh one when it has none."""
    data = frame.jpeg
    if data is None:
        out = io.BytesIO()
        Image.fromarray(frame.rgb).save(out, format="JPEG", quality=JPEG_QUALITY)
        data = out.getvalue()
    return base64.b64encode(data).decode("ascii")


def _wav_samples(data: str) -> np.ndarray:
    """A reference audio delta (base64 of a whole 16-bit mono WAV file) as float32 talker samples."""
    with wave.open(io.BytesIO(base64.b64decode(data))) as wav:
        if (wav.getframerate(), wav.getnchannels(), wav.getsampwidth()) != (TALKER_SAMPLE_RATE, 1, 2):
            raise EngineError(
                f"upstream audio is {wav.getframerate()} Hz x{wav.getnchannels()}, expected 24 kHz mono PCM16"
            )
        pcm = wav.readframes(wav.getnframes())
    return np.frombuffer(pcm, dtype="<i2").astype(np.float32) / 32768.0


class RemoteUnderstandEngine:
    """Understanding turns answered by upstream `/v1/video/chat/stream` servers."""

    name = "remote"

    def __init__(self, pool: UpstreamPool) -> None:
        self.pool = pool
        self._sockets: dict[str, aiohttp.ClientWebSocketResponse] = {}

    async def _send_turn(self, ws: aiohttp.ClientWebSocketResponse, turn: UnderstandTurn) -> None:
        count = max(1, len(turn.frames))
        config: dict[str, Any] = {
            "type": "session.config",
            "modalities": list(turn.modalities),
            "num_frames": count,  # the session already sampled: the upstream takes them all
            "max_frames": count,
            "enable_frame_filter": False,  # ... and already filtered them
        }
        if turn.system_prompt is not None:
            config["system_prompt"] = turn.system_prompt
        await ws.send_json(config)
        images = await asyncio.to_thread(lambda: [_jpeg_base64(f) for f in turn.frames])
        for image in images:
            await ws.send_json({"type": "video.frame", "data": image})
        for start in range(0, len(turn.audio_pcm16), AUDIO_CHUNK_BYTES):
            chunk = turn.audio_pcm16[start : start + AUDIO_CHUNK_BYTES]
            await ws.send_json({"type": "audio.chunk", "data": base64.b64encode(chunk).decode("ascii")})
        await ws.send_json({"type": "video.query", "text": turn.query})
        await ws.send_json({"type": "video.done"})

    async def generate(self, turn: UnderstandTurn) -> AsyncIterator[UnderstandOutput]:
        async with self.pool.connect() as (upstream, ws):
            self._sockets[turn.request_id] = ws
            try:
                await self._send_turn(ws, turn)
                text = ""
                while True:
                    event = await _receive(self.pool, upstream, ws, UNDERSTAND_MESSAGE_BYTES)
                    if isinstance(event, bytes):
                        continue
                    kind = event.get("type")
                    if kind == "response.text.delta":
                        text += event["delta"]
                        if len(text) > MAX_ANSWER_CHARS:
                            raise EngineError(f"upstream {upstream.url} answered over {MAX_ANSWER_CHARS} characters")
                        yield TextDelta(event["delta"])
                    elif kind == "response.text.done" and event["text"].startswith(text) and event["text"] != text:
                        # Without async chunking upstream sends no deltas, only the full text here.
                        yield TextDelta(event["text"][len(text) :])
                        text = event["text"]
                    elif kind in AUDIO_DELTA_TYPES:
                        yield AudioChunk(await asyncio.to_thread(_wav_samples, event["data"]))
                    elif kind == "error":
                        raise EngineError(f"upstream {upstream.url}: {event.get('message')}")
                    elif kind == "session.done":
                        return
            finally:
                self._sockets.pop(turn.request_id, None)

    async def abort(self, request_id: str) -> None:
        """Closing the socket aborts the upstream request (the reference aborts on disconnect)."""
        ws = self._sockets.pop(request_id, None)
        if ws is not None:
            await ws.close()

    async def close(self) -> None:
        await self.pool.close()


@dataclass
class _RemoteGeneration:
    ws: aiohttp.ClientWebSocketResponse
    chunk_index: int = 0
    events: ChunkEvents | None = None  # the upstream's report for the chunk it is sending
    interactions: dict[str, asyncio.Future[int]] = field(default_factory=dict)


def _start_message(request: GenerateRequest) -> dict[str, Any]:
    fields: dict[str, Any] = {
        "prompt": request.prompt,
        "negative_prompt": request.negative_prompt,
        "width": request.width,
        "height": request.height,
        "num_frames": request.num_frames,
        "fps": request.fps,
        "seed": request.seed,
        "num_inference_steps": request.num_inference_steps,
        "guidance_scale": request.guidance_scale,
        "extra_params": request.extra_params or None,
        "lora": request.lora,
        **request.sampling_overrides,  # what the client set explicitly, as it set it
    }
    return {"type": "session.start", **{k: v for k, v in fields.items() if v is not None}}


class RemoteGenerateEngine:
    """Generations streamed from upstream `/v1/realtime/video` servers, decoded into frames."""

    name = "remote"

    def __init__(self, pool: UpstreamPool) -> None:
        self.pool = pool
        self._running: dict[str, _RemoteGeneration] = {}

    def _on_event(self, generation: _RemoteGeneration, upstream: Upstream, event: dict[str, Any]) -> bool:
        """Handle one upstream event; True at the end of the generation."""
        kind = event.get("type")
        if kind == "video.chunk_metadata" and event.get("kind", "media") == "media":
            generation.chunk_index = int(event.get("generation_chunk_index", generation.chunk_index))
            generation.events = ChunkEvents.from_report(event)
        elif kind == "session.interaction.queued":
            future = generation.interactions.pop(event.get("event_id", ""), None)
            if future is not None and not future.done():
                future.set_result(int(event.get("apply_from_chunk", generation.chunk_index + 1)))
        elif kind == "error" and event.get("code") in INTERACTION_ERROR_CODES:
            future = generation.interactions.pop(event.get("event_id", ""), None)
            if future is not None and not future.done():
                future.set_exception(EngineError(event.get("message", "interaction failed")))
        elif kind == "error":
            raise EngineError(f"upstream {upstream.url}: {event.get('message')}")
        return kind == "session.done"

    async def generate(self, request: GenerateRequest) -> AsyncIterator[VideoChunk]:
        async with self.pool.connect() as (upstream, ws):
            generation = self._running[request.request_id] = _RemoteGeneration(ws)
            decoder = FragmentedMp4Decoder()
            try:
                await ws.send_json(_start_message(request))
                while True:
                    message = await _receive(self.pool, upstream, ws, EVENT_BYTES)
                    if isinstance(message, dict):
                        if self._on_event(generation, upstream, message):
                            return
                        continue
                    frames = await asyncio.to_thread(decoder.decode, message)
                    if frames:
                        yield VideoChunk(frames=frames, chunk_index=generation.chunk_index, events=generation.events)
            finally:
                self._running.pop(request.request_id, None)
                for future in generation.interactions.values():
                    future.cancel()

    async def interact(self, request_id: str, event_id: str, prompt: str, transition_chunks: int = 0) -> int:
        generation = self._running.get(request_id)
        if generation is None:
            raise ValueError(f"no running generation {request_id}")
        future: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        generation.interactions[event_id] = future
        interaction = {"event_id": event_id, "event": {"prompt": prompt}, "transition_chunks": transition_chunks}
        await generation.ws.send_json({"type": "session.interaction", "interaction": interaction})
        async with asyncio.timeout(INTERACTION_TIMEOUT_S):
            return await future

    async def abort(self, request_id: str) -> None:
        generation = self._running.pop(request_id, None)
        if generation is not None and not generation.ws.closed:
            await generation.ws.send_json({"type": "session.stop"})
            await generation.ws.close()

    async def close(self) -> None:
        await self.pool.close()
