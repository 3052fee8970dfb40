"""The remote engine: an existing vLLM-Omni deployment (or another rtc-omni) as the model.

Understanding: each session holds one WebSocket to an upstream's `/v1/video/chat/stream` and
streams its sampled frames and audio to it (engines/upstream_session.py); a turn is a `video.query`,
and the answer maps back to `TextDelta` and `AudioChunk` (base64 WAV deltas, either event name).
Without text deltas (vLLM-Omni's `VLLM_VIDEO_ASYNC_CHUNK=off`) the text comes whole in
`response.text.done`, which may also precede the last deltas: only new text is passed on.
Generation: each one opens `/v1/realtime/video`, forwards `session.start` (with the client's model
name: the upstream checks it), interactions (also ones sent before the upstream's `video.start`)
and stops, and decodes the fMP4 chunks into frames (media/fmp4.py). Upstream addresses stay in the
log: the errors this engine raises are shown to clients.
"""

from __future__ import annotations

import asyncio
import base64
import io
import logging
import wave
from collections.abc import AsyncIterator
from contextlib import aclosing
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import numpy as np
from aiohttp import WSCloseCode

from ..config import UpstreamProtocol
from ..media.fmp4 import FragmentedMp4Decoder
from ..pcm import TALKER_SAMPLE_RATE, pcm16_to_float
from ..protocol import generate_messages as generate_proto
from ..protocol import understand_messages as understand_proto
from ..protocol.codec import DecodedEvent, MalformedEvent
from .engine import (
    AudioChunk,
    ChunkEvents,
    ContextLost,
    EngineError,
    EngineSession,
    GenerateRequest,
    LiveSettings,
    TextDelta,
    UnderstandOutput,
    UnderstandTurn,
    VideoChunk,
)
from .realtime_upstream import NotServed, RealtimeUpstreamSession
from .upstream import Upstream, UpstreamPool, check_answer_length
from .upstream_session import CLOSED_MID_REQUEST, UpstreamSession, UpstreamTurn, too_big_message, unreadable

logger = logging.getLogger(__name__)

INTERACTION_TIMEOUT_S = 5.0
# What one upstream message may weigh, by kind, so a hostile or broken upstream costs at most this.
# A generation's fMP4 chunks may weigh the pool's default (upstream.DEFAULT_MAX_MESSAGE_BYTES).
EVENT_BYTES = 1024 * 1024  # one JSON event of a generation, checked before it is parsed
INTERACTION_ERROR_CODES = ("event_id_conflict", "interaction_failed", "invalid_interaction")


async def _receive(
    pool: UpstreamPool, upstream: Upstream, ws: aiohttp.ClientWebSocketResponse, max_event_bytes: int
) -> DecodedEvent | bytes:
    """The next event (typed) or binary message; EngineError, and the upstream marked down, if it went
    away or sent a message over its size cap."""
    message = await ws.receive()
    if message.type == aiohttp.WSMsgType.TEXT:
        if len(message.data) > max_event_bytes:
            pool.mark_down(upstream)
            logger.warning("upstream %s sent a %d-byte event", upstream.url, len(message.data))
            raise EngineError(f"the upstream sent a {len(message.data)}-byte event (at most {max_event_bytes})")
        event = generate_proto.decode_server_event(message.data)
        if isinstance(event, generate_proto.GenerateError) and event.message == generate_proto.NOT_AVAILABLE:
            pool.mark_not_serving(upstream)  # one model per vLLM-Omni server: it serves the other endpoint
        return event
    if message.type == aiohttp.WSMsgType.BINARY:
        return bytes(message.data)
    logger.warning("upstream %s closed the connection mid-request", upstream.url)
    pool.mark_down(upstream)
    if message.type == aiohttp.WSMsgType.ERROR and getattr(message.data, "code", None) == WSCloseCode.MESSAGE_TOO_BIG:
        raise EngineError(too_big_message(pool.max_message_bytes))
    raise EngineError(CLOSED_MID_REQUEST)


def _wav_samples(data: str) -> np.ndarray:
    """A reference audio delta (base64 of a whole 16-bit mono WAV file) as float32 talker samples."""
    with wave.open(io.BytesIO(base64.b64decode(data))) as wav:
        if (wav.getframerate(), wav.getnchannels(), wav.getsampwidth()) != (TALKER_SAMPLE_RATE, 1, 2):
            raise EngineError(
                f"upstream audio is {wav.getframerate()} Hz x{wav.getnchannels()}, expected 24 kHz mono PCM16"
            )
        pcm = wav.readframes(wav.getnframes())
    return pcm16_to_float(pcm)


def _one_turn_settings(turn: UnderstandTurn, realtime: bool = False) -> LiveSettings:
    """For a turn from no live session: an upstream session that takes exactly the turn's frames."""
    count = max(1, len(turn.frames))
    return LiveSettings(
        model=turn.model,
        system_prompt=turn.system_prompt,
        modalities=turn.modalities,
        num_frames=count,
        max_frames=count,
        use_audio_in_video=turn.use_audio_in_video,
        sampling_params_list=turn.sampling_params_list,
        audio_streamed=False,
        realtime=realtime,
    )


class RemoteUnderstandEngine:
    """Turns answered by upstream servers, one upstream session per session (a `LiveUnderstandEngine`):
    a realtime conversation's in a duplex `/v1/realtime` session where an upstream serves them
    (`realtime_pool`), anything else on `/v1/video/chat/stream`."""

    name = "remote"

    def __init__(
        self, pool: UpstreamPool, realtime_pool: UpstreamPool | None = None, protocol: UpstreamProtocol = "auto"
    ) -> None:
        """`pool`: the upstreams' `/v1/video/chat/stream`; `realtime_pool`: their `/v1/realtime` (None
        with `protocol` legacy). With `protocol` auto, realtime sessions speak `/v1/realtime` (the older
        endpoint where no upstream serves it) and understanding sessions the older endpoint; with
        realtime, every session speaks `/v1/realtime` (--upstream-protocol)."""
        self.pool = pool
        self.realtime_pool = realtime_pool
        self.protocol = protocol

    def open_session(self, session_id: str, settings: LiveSettings) -> EngineSession:
        if self.realtime_pool is not None and (settings.realtime or self.protocol == "realtime"):
            return RealtimeUpstreamSession(self.realtime_pool, session_id, settings)
        return UpstreamSession(self.pool, session_id, settings)

    async def generate(self, turn: UnderstandTurn) -> AsyncIterator[UnderstandOutput]:
        session = turn.engine_session
        out_of_band = session is None and bool(turn.input_ids)  # a realtime session's response apart from it
        if self.realtime_pool is not None and (isinstance(session, RealtimeUpstreamSession) or out_of_band):
            try:
                async for output in self._realtime(turn, self.realtime_pool):
                    yield output
                return
            except NotServed as exc:
                if self.protocol == "realtime":
                    raise
                if not turn.frames:
                    raise EngineError(f"{exc}, and the older endpoint answers only with a camera frame") from exc
                logger.info("turn %s: no upstream serves /v1/realtime; the older endpoint answers", turn.request_id)
        async for output in self._legacy(turn):
            yield output

    async def _realtime(self, turn: UnderstandTurn, pool: UpstreamPool) -> AsyncIterator[UnderstandOutput]:
        """In the session's upstream realtime session, or (out of band) one of its own."""
        session = turn.engine_session
        own = not isinstance(session, RealtimeUpstreamSession)
        if not isinstance(session, RealtimeUpstreamSession):
            session = RealtimeUpstreamSession(pool, turn.request_id, _one_turn_settings(turn, realtime=True))
        try:
            async with aclosing(session.answer(turn)) as outputs:
                async for output in outputs:
                    yield output
        finally:
            if own:
                await session.close()

    async def _legacy(self, turn: UnderstandTurn) -> AsyncIterator[UnderstandOutput]:
        session = turn.engine_session
        own = not isinstance(session, UpstreamSession)
        if not isinstance(session, UpstreamSession):
            session = UpstreamSession(self.pool, turn.request_id, _one_turn_settings(turn))
        frames = [f.jpeg for f in turn.frames]  # as the session buffered them: never encoded again
        text = ""
        try:
            # aclosing: an interrupt that closes this stream must end the upstream turn too, at once.
            async with aclosing(session.turn(UpstreamTurn(turn.query, turn.audio_pcm16, frames))) as events:
                async for event in events:
                    match event:
                        case ContextLost():
                            yield event
                        case understand_proto.TextDeltaEvent(delta=delta):
                            text += delta
                            check_answer_length(len(text))
                            yield TextDelta(delta)
                        case understand_proto.TextDone(text=whole) if whole.startswith(text) and whole != text:
                            # Without async chunking upstream sends no deltas, only the full text here.
                            yield TextDelta(whole[len(text) :])
                            text = whole
                        case understand_proto.AudioDeltaEvent(data=data):
                            yield AudioChunk(await asyncio.to_thread(_wav_samples, data))
        finally:
            if own:
                await session.close()

    async def abort(self, request_id: str) -> None:
        """Nothing left to do: an unfinished turn closes its upstream socket as it ends, which makes
        the upstream abort the request at once."""

    async def close(self) -> None:
        await self.pool.close()


@dataclass
class _RemoteGeneration:
    ws: aiohttp.ClientWebSocketResponse | None = None  # None until the upstream socket is open
    started: asyncio.Event = field(default_factory=asyncio.Event)  # upstream's video.start, or the end
    ended: bool = False
    chunk_index: int = 0
    media_chunks: int = 0
    events: ChunkEvents | None = None  # the upstream's report for the chunk it is sending
    interactions: dict[str, asyncio.Future[int]] = field(default_factory=dict)


def _start_message(request: GenerateRequest) -> dict[str, Any]:
    fields: dict[str, Any] = {
        "model": request.model,
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

    def _on_event(self, generation: _RemoteGeneration, upstream: Upstream, event: DecodedEvent) -> bool:
        """Handle one upstream event; True at the end of the generation. Events of other types are
        skipped; one that cannot be read ends the generation."""
        match event:
            case generate_proto.VideoStart():
                generation.started.set()
            case generate_proto.VideoChunkMetadata(kind="media", generation_chunk_index=index):
                # A model served without streaming output sends one chunk, and no index (null).
                generation.chunk_index = index if index is not None else generation.media_chunks
                generation.media_chunks += 1
                generation.events = ChunkEvents(
                    started=event.started_event_ids, active=event.active_event_ids, completed=event.completed_event_ids
                )
            case generate_proto.InteractionQueued(event_id=event_id, apply_from_chunk=start):
                future = generation.interactions.pop(event_id, None)
                if future is not None and not future.done():
                    future.set_result(start if start is not None else generation.chunk_index + 1)
            case generate_proto.GenerateError(code=code, event_id=event_id) if code in INTERACTION_ERROR_CODES:
                future = generation.interactions.pop(event_id or "", None)
                if future is not None and not future.done():
                    future.set_exception(EngineError(event.message))
            case generate_proto.GenerateError(message=message):
                logger.info("upstream %s: generation failed: %s", upstream.url, message)
                raise EngineError(f"upstream: {message}")
            case MalformedEvent():
                reason = unreadable(event)
                logger.info("upstream %s: generation failed: %s", upstream.url, reason)
                raise EngineError(reason)
        return isinstance(event, generate_proto.GenerationDone)

    async def generate(self, request: GenerateRequest) -> AsyncIterator[VideoChunk]:
        generation = self._running.setdefault(request.request_id, _RemoteGeneration())
        try:
            async with self.pool.connect() as (upstream, ws):
                generation.ws = ws
                decoder = FragmentedMp4Decoder()
                await ws.send_json(_start_message(request))
                while True:
                    message = await _receive(self.pool, upstream, ws, EVENT_BYTES)
                    if not isinstance(message, bytes):
                        if self._on_event(generation, upstream, message):
                            return
                        continue
                    frames = await asyncio.to_thread(decoder.decode, message)
                    if frames:
                        yield VideoChunk(frames=frames, chunk_index=generation.chunk_index, events=generation.events)
        finally:
            self._running.pop(request.request_id, None)
            generation.ended = True
            generation.started.set()
            for future in generation.interactions.values():
                future.cancel()

    async def interact(self, request_id: str, event_id: str, prompt: str, transition_chunks: int = 0) -> int:
        # An interaction may come before the upstream's video.start (even before generate() runs):
        # it waits for it, as vLLM-Omni's own handler queues one sent right after its video.start.
        generation = self._running.setdefault(request_id, _RemoteGeneration())
        try:
            async with asyncio.timeout(INTERACTION_TIMEOUT_S):
                await generation.started.wait()
        except TimeoutError:
            if generation.ws is None:
                self._running.pop(request_id, None)
            raise
        if generation.ended or generation.ws is None:
            raise ValueError(f"no running generation {request_id}")
        future: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        generation.interactions[event_id] = future
        interaction = {"event_id": event_id, "event": {"prompt": prompt}, "transition_chunks": transition_chunks}
        await generation.ws.send_json({"type": "session.interaction", "interaction": interaction})
        async with asyncio.timeout(INTERACTION_TIMEOUT_S):
            return await future

    async def abort(self, request_id: str) -> None:
        generation = self._running.pop(request_id, None)
        if generation is not None and generation.ws is not None and not generation.ws.closed:
            await generation.ws.send_json({"type": "session.stop"})
            await generation.ws.close()

    async def close(self) -> None:
        await self.pool.close()
