"""The generation session: one prompt in, one generated video out as a live track.

Transport-agnostic like the understanding session: raw control messages in (`receive_text`),
JSON events out through `send`, frames out through a `VideoSink` (the outgoing RTP track). It
owns vLLM-Omni's `/v1/realtime/video` state machine: `session.start` first, then stop, ping,
interactions, the stall clock, and `session.done` once the last frame has been sent.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Protocol

import numpy as np
from pydantic import ValidationError

from .. import metrics
from ..config import Settings
from ..engines.base import ChunkEvents, GenerateEngine, GenerateRequest, VideoChunk
from ..media.frames import normalize_videos
from ..media.recorder import Mp4Recorder
from ..protocol import generate as proto
from ..protocol.understand import BINARY_NOT_SUPPORTED, MESSAGE_QUEUE_FULL, ServerEvent
from ..tasks import TaskSet

logger = logging.getLogger(__name__)

MAX_MESSAGE_QUEUE = 64
ENGINE_CALL_TIMEOUT_S = 5.0
FRAME_IN_FLIGHT_S = 0.05
DEFAULT_WIDTH, DEFAULT_HEIGHT, DEFAULT_NUM_FRAMES = 832, 480, 132

GenerateState = Literal["waiting_start", "generating", "done", "closed"]


class VideoSink(Protocol):
    """Where generated frames go (the outgoing RTP video track)."""

    fps: float
    frames_sent: int
    on_frame_sent: Callable[[np.ndarray], Awaitable[None]] | None

    async def put(self, rgb: np.ndarray) -> None: ...

    def flush(self) -> int: ...

    def end_of_stream(self) -> None: ...

    async def wait_drained(self, timeout: float) -> bool: ...


@dataclass
class _Interaction:
    event_id: str
    start_chunk: int
    transition_chunks: int

    def phase(self, chunk: int) -> tuple[bool, bool, bool]:
        """(started, active, completed) at a chunk index, on vLLM-Omni's schedule: a transition of
        t chunks is active in t chunks from its start (one when t is 0) and completes in the last."""
        end = self.start_chunk + max(self.transition_chunks, 1) - 1
        return chunk == self.start_chunk, self.start_chunk <= chunk <= end, chunk == end


@dataclass
class GenerateCounters:
    chunks: int = 0
    frames_generated: int = 0
    errors_sent: int = 0
    interactions: int = 0


@dataclass
class GenerateSession:
    """State and behaviour of one streamed generation.

    `strict_reference` gives the reference's session semantics where ours differ (the WebSocket
    endpoint sets it, docs/websocket.md): a bad `session.start` ends the session, and so does
    `session.done` or a generation failure (which then sends no `session.done`).
    """

    session_id: str
    settings: Settings
    engine: GenerateEngine
    send: Callable[[dict[str, Any]], None]
    video: VideoSink
    reserve_recording: Callable[[str], Path] | None = None
    on_closed: Callable[[GenerateSession], None] | None = None
    strict_reference: bool = False

    state: GenerateState = "waiting_start"
    request_id: str | None = None
    counters: GenerateCounters = field(default_factory=GenerateCounters)

    def __post_init__(self) -> None:
        self._queue: asyncio.Queue[dict[str, Any]] = asyncio.Queue(MAX_MESSAGE_QUEUE)
        self._tasks = TaskSet()
        self._created_at = self._progress_at = self._last_message_at = time.monotonic()
        self._stopped = False
        self._engine_finished = False
        self._interactions: dict[str, _Interaction] = {}
        self._frame_size: tuple[int, int] | None = None
        self.recorder: Mp4Recorder | None = None
        self._generation: asyncio.Task[None] | None = None
        self._closer: asyncio.Task[None] | None = None
        self.closed = asyncio.Event()

    # ----------------------------------------------------------------- lifecycle

    def start(self) -> None:
        self._tasks.spawn(self._process_messages())
        self._tasks.spawn(self._watch())

    async def close(self) -> None:
        """End the session: abort an unfinished generation, cancel every task, finish the recording."""
        if self.state == "closed":
            return
        generating = self.state == "generating"
        self.state = "closed"
        if generating and not self._engine_finished:
            await self._abort()
        await self._tasks.cancel_all()
        self.video.flush()
        if self.recorder is not None:
            await self.recorder.finish()
        while not self._queue.empty():
            self._queue.get_nowait()
        self.closed.set()
        if self.on_closed is not None:
            self.on_closed(self)

    def notify(self, message: str) -> None:
        """Tell the client something as an `error` event (e.g. that the server is going away)."""
        self._error(message)

    def _close_soon(self) -> None:
        if self._closer is None:
            self._closer = asyncio.get_running_loop().create_task(self.close())

    def _emit(self, event: ServerEvent) -> None:
        if self.state == "closed":
            return
        if isinstance(event, proto.GenerateError):
            self.counters.errors_sent += 1
            metrics.ERRORS.labels("generate", metrics.error_type(event.message)).inc()
        self.send(event.to_wire())

    def _error(self, message: str, code: str | None = None, event_id: str | None = None) -> None:
        event = proto.GenerateError(message=message)
        if code is not None:
            event.code = code
        if self.request_id is not None:
            event.request_id = self.request_id
        if event_id is not None:
            event.event_id = event_id
        self._emit(event)

    def _start_failed(self, message: str) -> None:
        """A bad `session.start`: the reference ends the session, we keep waiting for a good one."""
        self._error(message)
        if self.strict_reference:
            self._close_soon()

    async def _watch(self) -> None:
        """Start timeout, stall timeout while generating, idle timeout once done."""
        while True:
            await asyncio.sleep(min(0.25, self.settings.engine_stall_timeout / 4))
            now = time.monotonic()
            if self.state == "waiting_start" and now - self._created_at > self.settings.config_timeout:
                self._error(proto.TIMEOUT_WAITING_FOR_START)
                self._close_soon()
                return
            if (
                self.state == "generating"
                and not self._stopped
                and now - self._progress_at > self.settings.engine_stall_timeout
            ):
                self._error(proto.STALL_TIMEOUT)
                await self._stop()
            if self.state == "done" and now - self._last_message_at > self.settings.idle_timeout:
                self._close_soon()
                return

    # ----------------------------------------------------------------- control messages

    def receive_text(self, raw: str) -> None:
        if self.state == "closed" or self._closer is not None:
            return
        self._last_message_at = time.monotonic()
        limit = proto.MAX_START_MESSAGE_BYTES if self.state == "waiting_start" else proto.MAX_CONTROL_MESSAGE_BYTES
        waiting = self.state == "waiting_start"
        report = self._start_failed if waiting else self._error
        if len(raw.encode()) > limit:
            report(proto.START_TOO_LARGE if waiting else proto.CONTROL_TOO_LARGE)
            return
        try:
            msg = json.loads(raw)
        except (json.JSONDecodeError, RecursionError):
            report(proto.INVALID_JSON_IN_START if waiting else proto.INVALID_JSON_MESSAGE)
            return
        if not isinstance(msg, dict):
            report(proto.START_NOT_AN_OBJECT if waiting else proto.CONTROL_NOT_AN_OBJECT)
            return
        try:
            self._queue.put_nowait(msg)
        except asyncio.QueueFull:
            self._error(MESSAGE_QUEUE_FULL)

    def receive_binary(self, data: bytes) -> None:
        self._last_message_at = time.monotonic()
        self._error(BINARY_NOT_SUPPORTED)

    async def _process_messages(self) -> None:
        while True:
            msg = await self._queue.get()
            try:
                await self._handle(msg)
            except Exception:  # a bug must not take the session down
                logger.exception("session %s: message handling failed", self.session_id)
                self._error(f"Internal error handling {msg.get('type')!s}")

    async def _handle(self, msg: dict[str, Any]) -> None:
        msg_type = msg.get("type")
        if self.state == "waiting_start":
            if msg_type != "session.start":
                self._start_failed(proto.expected_start_error(msg_type))
                return
            await self._handle_start(msg)
            return
        if msg_type == "session.start":
            self._error(proto.START_ALREADY_RECEIVED)
        elif msg_type == "session.stop":
            if self.state == "generating":
                await self._stop()
        elif msg_type == "session.ping":
            self._progress_at = time.monotonic()
            self._emit(proto.SessionPong())
        elif msg_type == "session.interaction":
            await self._handle_interaction(msg)
        elif msg_type == "session.prompt_update":
            self._error(proto.PROMPT_UPDATE_REPLACED)
        else:
            self._error(proto.unknown_message_type_error(msg_type))

    async def _handle_start(self, msg: dict[str, Any]) -> None:
        output_format = msg.get("format", "m4s")
        if output_format != "m4s":  # fMP4 is meaningless over RTP, but only "m4s" is valid upstream
            self._start_failed(proto.INVALID_FORMAT)
            return
        try:
            request = proto.VideoGenerationRequest.model_validate(proto.coerce_start_fields(msg))
        except ValidationError as exc:
            self._start_failed(proto.invalid_start_error(str(exc)))
            return
        served = self.settings.model  # None: a gateway that lets its upstream check the name
        if request.model is not None and served is not None and request.model != served:
            self._start_failed(proto.model_mismatch_error(request.model, served))
            return
        params = request.resolve_video_params()
        self.request_id = f"video_stream-{uuid.uuid4().hex}"
        engine_request = GenerateRequest(
            request_id=self.request_id,
            prompt=request.prompt,
            negative_prompt=request.negative_prompt,
            width=params.width or DEFAULT_WIDTH,
            height=params.height or DEFAULT_HEIGHT,
            num_frames=params.num_frames or DEFAULT_NUM_FRAMES,
            fps=params.fps or proto.DEFAULT_FPS,
            seed=request.seed,
            num_inference_steps=request.num_inference_steps,
            guidance_scale=request.guidance_scale,
            extra_params=dict(request.extra_params or {}),
            sampling_overrides={
                name: getattr(request, name)
                for name in proto.SAMPLING_FIELDS
                if name in request.model_fields_set and getattr(request, name) is not None
            },
            lora=request.lora,
            model=request.model,
        )
        self.video.fps = float(engine_request.fps)
        if request.record and self.reserve_recording is not None:
            self.recorder = Mp4Recorder(self.reserve_recording(self.session_id), engine_request.fps)
            self.video.on_frame_sent = self.recorder.write
        self.state = "generating"
        self._progress_at = time.monotonic()
        self._emit(proto.VideoStart(request_id=self.request_id, config=request.model_dump(exclude_none=True)))
        self._generation = self._tasks.spawn(self._generate(engine_request))

    async def _handle_interaction(self, msg: dict[str, Any]) -> None:
        if self.state != "generating" or self._stopped:
            self._error("No generation in progress", code=proto.INTERACTION_FAILED)
            return
        try:
            interaction = proto.Interaction.model_validate(msg.get("interaction"))
        except ValidationError as exc:
            self._error(f"Invalid session.interaction: {exc}", code=proto.INVALID_INTERACTION)
            return
        event_id = interaction.event_id or f"evt-{uuid.uuid4().hex[:12]}"
        if event_id in self._interactions:
            self._error(f"Duplicate event_id: {event_id}", code=proto.EVENT_ID_CONFLICT, event_id=event_id)
            return
        assert self.request_id is not None
        transition = interaction.transition_chunks
        if transition is None:
            transition = proto.DEFAULT_TRANSITION_CHUNKS
        try:
            async with asyncio.timeout(ENGINE_CALL_TIMEOUT_S):
                start_chunk = await self.engine.interact(
                    self.request_id, event_id, interaction.event.prompt, transition
                )
        except Exception as exc:
            self._error(f"Interaction failed: {exc}", code=proto.INTERACTION_FAILED, event_id=event_id)
            return
        self._interactions[event_id] = _Interaction(event_id, start_chunk, transition)
        self.counters.interactions += 1
        self._emit(proto.InteractionQueued(request_id=self.request_id, event_id=event_id, apply_from_chunk=start_chunk))

    # ----------------------------------------------------------------- generation

    async def _abort(self) -> None:
        if self.request_id is None:
            return
        try:
            async with asyncio.timeout(ENGINE_CALL_TIMEOUT_S):
                await self.engine.abort(self.request_id)
        except Exception:
            logger.warning("session %s: abort failed", self.session_id, exc_info=True)

    async def _stop(self) -> None:
        """`session.stop` or a stall: abort the engine, drop unsent frames, report what was sent."""
        if self._stopped:
            return
        self._stopped = True
        if not self._engine_finished:
            await self._abort()
        generation = self._generation
        if generation is not None and generation is not asyncio.current_task() and not generation.done():
            generation.cancel()  # a hung engine may ignore the abort
            await asyncio.wait([generation], timeout=ENGINE_CALL_TIMEOUT_S)
        self.video.flush()
        await self._end_stream()
        await self._finish(stopped=True)

    async def _end_stream(self) -> None:
        """Release the last frame at the peer, and let it leave before `session.done` does."""
        self.video.end_of_stream()
        await self.video.wait_drained(timeout=2.0 / max(self.video.fps, 1.0) + 1.0)
        await asyncio.sleep(FRAME_IN_FLIGHT_S)

    async def _finish(self, *, stopped: bool) -> None:
        if self.state != "generating":
            return
        self.state = "done"
        self._last_message_at = time.monotonic()
        assert self.request_id is not None
        if self.recorder is not None:
            await self.recorder.finish()  # the recording is downloadable once session.done arrives
        self._emit(
            proto.GenerationDone(
                request_id=self.request_id, chunks=self.counters.chunks, frames=self.video.frames_sent, stopped=stopped
            )
        )
        if self.strict_reference:
            self._close_soon()  # one reference session is one generation

    def _scheduled_events(self, chunk_index: int) -> ChunkEvents:
        """Interaction progress derived from the chunk each was scheduled for, for engines that
        do not report it themselves."""
        events = ChunkEvents()
        for interaction in self._interactions.values():
            started, active, completed = interaction.phase(chunk_index)
            if started:
                events.started.append(interaction.event_id)
            if active:
                events.active.append(interaction.event_id)
            if completed:
                events.completed.append(interaction.event_id)
        return events

    def _chunk_metadata(self, chunk: VideoChunk, first: int, count: int) -> proto.VideoChunkMetadata:
        assert self.request_id is not None
        events = chunk.events if chunk.events is not None else self._scheduled_events(chunk.chunk_index)
        return proto.VideoChunkMetadata(
            request_id=self.request_id,
            num_frames=count,
            generation_chunk_index=chunk.chunk_index,
            first_frame_index=first,
            last_frame_index=first + count - 1,
            started_event_ids=list(events.started),
            active_event_ids=list(events.active),
            completed_event_ids=list(events.completed),
        )

    async def _generate(self, request: GenerateRequest) -> None:
        stream = self.engine.generate(request)
        try:
            async for chunk in stream:
                self._progress_at = time.monotonic()
                if self._stopped:
                    return
                frames = [f for video in await asyncio.to_thread(normalize_videos, chunk.frames) for f in video]
                if not frames:
                    raise ValueError("No video outputs found in generation result.")
                size = (frames[0].shape[1], frames[0].shape[0])
                if self._frame_size is None:
                    self._frame_size = size
                elif size != self._frame_size:
                    raise ValueError(f"frame size changed from {self._frame_size} to {size}; it must stay fixed")
                first = self.counters.frames_generated
                self.counters.chunks += 1
                self.counters.frames_generated += len(frames)
                self._emit(self._chunk_metadata(chunk, first, len(frames)))
                for frame in frames:
                    await self.video.put(frame)
                    self._progress_at = time.monotonic()
                    if self._stopped:
                        return
            self._engine_finished = True
            # The session is done when its last frame has left, not when the engine returned.
            drain_limit = self.counters.frames_generated / max(self.video.fps, 1.0) + self.settings.engine_stall_timeout
            await self.video.wait_drained(drain_limit)
            await self._end_stream()
            await self._finish(stopped=False)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            logger.info("session %s: generation failed: %s", self.session_id, exc)
            self._error(str(exc) or type(exc).__name__)
            if self.strict_reference and not self._stopped:
                self.video.flush()
                self._close_soon()  # the reference ends without session.done (close aborts the engine)
            elif not self._stopped:
                await self._stop()
        finally:
            await stream.aclose()  # type: ignore[attr-defined]

    # ----------------------------------------------------------------- introspection

    def stats(self) -> dict[str, Any]:
        c = self.counters
        return {
            "kind": "generate",
            "state": self.state,
            "request_id": self.request_id,
            "chunks": c.chunks,
            "frames_generated": c.frames_generated,
            "frames_sent": self.video.frames_sent,
            "interactions": c.interactions,
            "errors_sent": c.errors_sent,
            "recording": self.recorder is not None,
        }
