"""The generation session: one prompt in, one generated video out as a live track.

A state machine over the session skeleton (session.py), transport-agnostic like the understanding
session: control messages parsed by protocol/generate_messages.py in, events out through `send`, frames
out through a `VideoSink` (the outgoing RTP track). It owns vLLM-Omni's `/v1/realtime/video`
state machine: `session.start` first, then stop, ping, interactions, the stall clock, and
`session.done` once the last frame has been sent.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal

import numpy as np

from ..engines.engine import ChunkEvents, GenerateEngine, GenerateRequest, VideoChunk
from ..media.frames import normalize_videos
from ..media.recorder import Mp4Recorder
from ..protocol import generate_messages as proto
from ..protocol.codec import Refusal
from ..protocol.validation import error_text
from .outputs import VideoSink
from .recordings import RecordingsFull
from .session import ENGINE_CALL_TIMEOUT_S, Session

logger = logging.getLogger(__name__)

FRAME_IN_FLIGHT_S = 0.05
DEFAULT_WIDTH, DEFAULT_HEIGHT, DEFAULT_NUM_FRAMES = 832, 480, 132

GenerateState = Literal["waiting_start", "generating", "done", "closed"]


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
    interactions: int = 0


@dataclass(kw_only=True)
class GenerateSession(Session[proto.ClientMessage, GenerateEngine]):
    """State and behaviour of one streamed generation.

    With `strict_reference` (docs/websocket.md): a bad `session.start` ends the session, and so
    does `session.done` or a generation failure (which then sends no `session.done`).
    """

    kind: ClassVar[str] = "generate"
    max_messages: ClassVar[int] = 64
    binary_refusal: ClassVar[Refusal] = proto.BINARY_REFUSAL

    video: VideoSink
    reserve_recording: Callable[[str, float], Mp4Recorder] | None = None  # RecordingStore.reserve
    recording_url: str | None = None  # where session.done says the recording is fetched (with its token)

    state: GenerateState = "waiting_start"
    request_id: str | None = None
    counters: GenerateCounters = field(default_factory=GenerateCounters)

    def __post_init__(self) -> None:
        super().__post_init__()
        self._progress_at = time.monotonic()
        self._stopped = False
        self._engine_finished = False
        self._interactions: dict[str, _Interaction] = {}
        self._frame_size: tuple[int, int] | None = None
        self.recorder: Mp4Recorder | None = None
        self._generation: asyncio.Task[None] | None = None

    # ----------------------------------------------------------------- lifecycle

    async def _stop_work(self) -> None:
        generating = self.state == "generating"
        self.state = "closed"
        if generating and not self._engine_finished:
            await self._abort()

    async def _release(self) -> None:
        self.video.flush()
        if self.recorder is not None:
            await self.recorder.finish()

    def _error(self, message: str, code: str | None = None, event_id: str | None = None) -> None:
        event = proto.GenerateError(message=message)
        if code is not None:
            event.code = code
        if self.request_id is not None:
            event.request_id = self.request_id
        if event_id is not None:
            event.event_id = event_id
        self._emit(event)

    def _watch_period(self) -> float:
        return min(0.25, self.settings.engine_stall_timeout / 4)

    async def _check_clocks(self, now: float) -> bool:
        """The stall timeout while generating, the idle timeout once done."""
        if (
            self.state == "generating"
            and not self._stopped
            and now - self._progress_at > self.settings.engine_stall_timeout
        ):
            self._error(proto.STALL_TIMEOUT)
            await self._stop()
        if self.state == "done" and now - self._last_activity > self.settings.idle_timeout:
            self._close_soon()
            return True
        return False

    # ----------------------------------------------------------------- control messages

    def _decode(self, raw: str) -> proto.ClientMessage | Refusal:
        return proto.decode(raw, awaiting_start=self.state == "waiting_start")

    def _wait_limit(self) -> float | None:
        if self.state != "waiting_start":
            return None
        return self._first_message_wait()

    def _wait_expired(self) -> bool:
        self._error(proto.TIMEOUT_WAITING_FOR_START)
        self._close_soon()
        return True

    async def _handle(self, message: proto.ClientMessage) -> bool:
        if self.state == "waiting_start":
            if isinstance(message, proto.StartMessage):
                self._handle_start(message)
            else:  # a bad session.start: the reference ends the session, we keep waiting for a good one
                self._ends_reference_session(proto.expected_start_error(message.type))
            return False
        match message:
            case proto.StartMessage():
                self._error(proto.START_ALREADY_RECEIVED)
            case proto.StopMessage():
                if self.state == "generating":
                    await self._stop()
            case proto.PingMessage():
                self._progress_at = time.monotonic()
                self._emit(proto.SessionPong())
            case proto.InteractionMessage():
                await self._handle_interaction(message)
            case proto.PromptUpdateMessage():
                self._error(proto.PROMPT_UPDATE_REPLACED)
            case _:
                self._error(proto.unknown_message_type_error(message.type))
        return False

    def _handle_start(self, message: proto.StartMessage) -> None:
        request = message.request
        if request is None:
            self._ends_reference_session(message.invalid)
            return
        served = self.settings.model  # None: a gateway that lets its upstream check the name
        if request.model is not None and served is not None and request.model != served:
            self._ends_reference_session(proto.model_mismatch_error(request.model, served))
            return
        params = request.resolve_video_params()
        width, height = params.width or DEFAULT_WIDTH, params.height or DEFAULT_HEIGHT
        num_frames, fps = params.num_frames or DEFAULT_NUM_FRAMES, params.fps or proto.DEFAULT_FPS
        settings = self.settings
        too_large = proto.video_limit_problem(
            width, height, fps, num_frames, settings.max_video_pixels, settings.max_video_fps, settings.max_video_frames
        )
        if too_large is not None:
            self._ends_reference_session(proto.invalid_start_error(too_large))
            return
        if request.record and self.reserve_recording is not None:
            try:
                self.recorder = self.reserve_recording(self.session_id, fps)
            except RecordingsFull as exc:
                self._ends_reference_session(proto.invalid_start_error(str(exc)))
                return
            self.video.on_frame_sent = self._record
        self.request_id = f"video_stream-{uuid.uuid4().hex}"
        engine_request = GenerateRequest(
            request_id=self.request_id,
            prompt=request.prompt,
            negative_prompt=request.negative_prompt,
            width=width,
            height=height,
            num_frames=num_frames,
            fps=fps,
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
        self.state = "generating"
        self._progress_at = time.monotonic()
        self._emit(proto.VideoStart(request_id=self.request_id, config=request.model_dump(exclude_none=True)))
        self._generation = self._tasks.spawn(self._generate(engine_request))

    async def _handle_interaction(self, message: proto.InteractionMessage) -> None:
        if self.state != "generating" or self._stopped:
            self._error("No generation in progress", code=proto.INTERACTION_FAILED)
            return
        interaction = message.interaction
        if interaction is None:
            self._error(message.invalid, code=proto.INVALID_INTERACTION)
            return
        event_id = interaction.event_id or f"evt-{uuid.uuid4().hex[:12]}"
        if event_id in self._interactions:
            self._error(proto.duplicate_event_id_error(event_id), code=proto.EVENT_ID_CONFLICT, event_id=event_id)
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
        if self.request_id is not None:
            await self._abort_request(self.request_id)

    async def _stop(self) -> None:
        """`session.stop` or a stall: abort the engine, drop unsent frames, report what was sent."""
        if self._stopped:
            return
        self._stopped = True
        if not self._engine_finished:
            await self._abort()
        generation = self._generation
        if generation is not None and generation is not asyncio.current_task() and not generation.done():
            await self._cancel_task(generation)  # a hung engine may ignore the abort
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
        self._last_activity = time.monotonic()
        assert self.request_id is not None
        done = proto.GenerationDone(
            request_id=self.request_id, chunks=self.counters.chunks, frames=self.video.frames_sent, stopped=stopped
        )
        if self.recorder is not None:
            await self.recorder.finish()  # the recording is downloadable once session.done arrives
            done.recording = self.recording_url
        self._emit(done)
        if self.strict_reference:
            self._close_soon()  # one reference session is one generation

    async def _record(self, rgb: np.ndarray) -> None:
        """Add a sent frame to the recording; tell the client once, should it reach its size cap."""
        recorder = self.recorder
        assert recorder is not None
        was_full = recorder.full
        await recorder.write(rgb)
        if recorder.full and not was_full:
            self._error(
                f"recording stopped at {recorder.max_bytes} bytes (--max-recording-bytes); the generation goes on"
            )

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
            self._error(error_text(exc))
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
            "errors_sent": self.errors_sent,
            "recording": self.recorder is not None,
        }
