"""The understanding session: one live conversation about what the camera sees and the mic hears.

A state machine over the session skeleton (base.py), transport-agnostic: it takes control
messages parsed by protocol/understand.py, sampled camera frames and 16 kHz audio (the
`MediaSink` side), and emits events through `send` and speech through a `Talker`. It owns the
state machine of vLLM-Omni's `/v1/video/chat/stream`: config first, frame and audio buffers with
EVS, turns, interrupts, `video.done`, and the timeouts around them.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import logging
import time
import uuid
from collections import deque
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, ClassVar, Literal, Protocol

import av
import numpy as np
from PIL import Image

from .. import metrics
from ..engines.base import (
    TALKER_SAMPLE_RATE,
    AudioChunk,
    ContextLost,
    EngineError,
    EngineSession,
    LiveSettings,
    LiveUnderstandEngine,
    TextDelta,
    TurnFrame,
    UnderstandEngine,
    UnderstandTurn,
)
from ..media.echo import EchoReference
from ..media.evs import FrameSimilarityFilter
from ..media.images import ImageTooLarge, frame_thumbnail, frame_to_jpeg, open_image
from ..media.vad import SpeechStarted, SpeechStopped
from ..media.wav import float_to_pcm16, wav_base64
from ..protocol import understand as proto
from ..protocol.codec import Refusal
from ..protocol.validation import error_text
from .audio_buffer import AudioBuffer
from .base import Session
from .engine_stream import stall_bounded
from .frame_buffer import BufferedFrame, FrameBuffer
from .inbox import WorkItem
from .turn_taking import EchoIgnored, ServerVad

if TYPE_CHECKING:
    from ..media.ingest import MediaSink

logger = logging.getLogger(__name__)

MAX_HISTORY_MESSAGES = 16
TRACK_JPEG_QUALITY = 90

SessionState = Literal["configuring", "active", "finishing", "closed"]


class Talker(Protocol):
    """Where the session's speech goes (the outgoing RTP audio track)."""

    echo: EchoReference  # what it played recently, so its echo can be told from a person

    async def write(self, samples: np.ndarray) -> None: ...

    def flush(self) -> float: ...

    async def wait_drained(self, timeout: float) -> bool: ...


def _now_ms() -> float:
    return time.monotonic() * 1000.0


@dataclass
class SessionCounters:
    frames_received: int = 0
    frames_sampled: int = 0
    frames_filtered: int = 0
    frames_evicted: int = 0
    turns_started: int = 0
    turns_completed: int = 0
    turns_cancelled: int = 0
    turns_failed: int = 0


@dataclass
class _Turn:
    request_id: str
    task: asyncio.Task[None] | None = None
    engine_finished: bool = False
    text: str = ""
    text_done_sent: bool = False


@dataclass
class _PendingFrame:
    """The newest sampled camera frame, kept even when EVS filtered it (see `_turn_frames`).

    A filtered frame is JPEG-encoded only if a turn takes it: on a still scene EVS filters nearly
    every sampled frame, and a turn takes at most the newest. Until then it holds the fitted frame
    (within --max-image-pixels; one per session, two for the moment a cancelled turn's encode
    takes to finish)."""

    frame: BufferedFrame
    buffered: bool
    image: av.VideoFrame | None = None  # the fitted frame, while `frame.data` is not yet its JPEG

    async def encoded(self) -> BufferedFrame:
        """The frame with its JPEG, encoded at the first call (off the loop)."""
        if self.image is not None:
            jpeg = await asyncio.to_thread(frame_to_jpeg, self.image, TRACK_JPEG_QUALITY)
            self.frame, self.image = replace(self.frame, data=jpeg), None
        return self.frame


@dataclass(frozen=True)
class VadTurn(WorkItem):
    """Server VAD heard a complete utterance: answer it."""

    name = "vad_turn"
    audio: bytes
    speech_ms: float


class BargeIn(WorkItem):
    """Server VAD heard the user talk over the answer: interrupt it."""

    name = "barge_in"


@dataclass(kw_only=True)
class UnderstandSession(Session[proto.ClientMessage, UnderstandEngine]):
    """State and behaviour of one understanding conversation.

    With `strict_reference` (docs/websocket.md): a bad or missing `session.config` and a binary
    message end the session, an interrupt by a new query is silent, `response.text.done` goes out
    at the first audio output, and speech always comes back as `response.audio.delta` events.
    """

    kind: ClassVar[str] = "understand"
    max_messages: ClassVar[int] = 200
    binary_refusal: ClassVar[Refusal] = proto.BINARY_REFUSAL

    talker: Talker | None = None

    state: SessionState = "configuring"
    config: proto.SessionConfig | None = None
    counters: SessionCounters = field(default_factory=SessionCounters)

    def __post_init__(self) -> None:
        super().__post_init__()
        self._explicit_config = False
        self._config_queued = False  # judge what follows a queued config as the config's processor will
        self._frames = FrameBuffer(50)
        self._dc_filter: FrameSimilarityFilter | None = None
        self._track_filter: FrameSimilarityFilter | None = None
        self._latest_track_frame: _PendingFrame | None = None
        self._track_frame_seq = 0
        self._audio = AudioBuffer(proto.MAX_AUDIO_BUFFER_BYTES)
        self._server_vad: ServerVad | None = None
        self._history: deque[dict[str, Any]] = deque(maxlen=MAX_HISTORY_MESSAGES)
        self._turn: _Turn | None = None
        self._engine_session: EngineSession | None = None  # engine-side state, for engines that keep one

    # ----------------------------------------------------------------- lifecycle

    async def _stop_work(self) -> None:
        self.state = "closed"
        await self._cancel_turn(notify=False)
        if self._engine_session is not None:  # engine session hook (remote engine)
            await self._engine_session.close()

    async def _release(self) -> None:
        self._frames = FrameBuffer(1)
        self._latest_track_frame = None
        self._audio.clear()
        self._history.clear()

    def _error(self, message: str, request_id: str | None = None, detail: str | None = None) -> None:
        event = proto.ErrorEvent(message=message)
        if request_id is not None:
            event.request_id = request_id
        if detail is not None:
            event.detail = detail
        self._emit(event)

    def _ends_reference_session(self, message: str) -> None:
        """Also stop taking media and messages at once when the session is about to end."""
        super()._ends_reference_session(message)
        if self.strict_reference:
            self.state = "finishing"

    def _watch_period(self) -> float:
        return min(1.0, self.settings.idle_timeout / 4)

    async def _check_clocks(self, now: float) -> bool:
        if now - self._last_activity > self.settings.idle_timeout:
            self._error(proto.IDLE_TIMEOUT)
            self._close_soon()
            return True
        return False

    # ----------------------------------------------------------------- control messages

    def _decode(self, raw: str) -> proto.ClientMessage | Refusal:
        # What follows a queued config is judged as the config's processor will judge it.
        return proto.decode(raw, awaiting_config=self.config is None and not self._config_queued)

    def _reading(self) -> bool:
        return self.state not in ("finishing", "closed")

    def _queued(self, message: proto.ClientMessage) -> None:
        if isinstance(message, proto.DoneMessage):
            self.state = "finishing"  # the reference stops reading at video.done
        elif isinstance(message, proto.ConfigMessage):
            self._config_queued = True

    def _wait_limit(self) -> float | None:
        return self._first_message_wait() if self.config is None else None

    def _wait_expired(self) -> bool:
        """No config in time: the reference ends; we go on with the defaults."""
        self._ends_reference_session(proto.TIMEOUT_WAITING_FOR_CONFIG)
        if self.strict_reference:
            return True
        self._apply_config(proto.SessionConfig(), explicit=False)
        return False

    async def _do(self, work: WorkItem) -> None:
        if isinstance(work, VadTurn):
            await self._start_turn("", audio=work.audio, speech_ms=work.speech_ms)
        elif isinstance(work, BargeIn):
            await self._cancel_turn(notify=True)
        else:
            await super()._do(work)

    async def _handle(self, message: proto.ClientMessage) -> bool:
        if isinstance(message, proto.ConfigMessage):
            self._handle_config(message)
            return False
        if self.config is None:
            self._ends_reference_session(proto.expected_config_error(message.type))
            return self.strict_reference
        match message:
            case proto.FrameMessage():
                await self._handle_dc_frame(message)
            case proto.AudioMessage():
                if message.pcm:
                    self._append_audio(message.pcm)
            case proto.QueryMessage():
                await self._handle_query(message)
            case proto.DoneMessage():
                await self._finish()
                return True
            case proto.CancelMessage():
                if self._turn is None:
                    self._error(proto.NO_ACTIVE_RESPONSE)
                else:
                    await self._cancel_turn(notify=True)
            case proto.PingMessage():
                self._emit(proto.Pong())
            case _:
                self._error(proto.unknown_type_error(message.type))
        return False

    def _handle_config(self, message: proto.ConfigMessage) -> None:
        if self._explicit_config:
            self._error(proto.CONFIG_ALREADY_APPLIED)
        elif message.config is None:
            self._ends_reference_session(message.invalid)
        else:
            self._apply_config(message.config, explicit=True)

    def use_default_config(self) -> None:
        """Take media at once with the defaults (a WHIP publisher never configures); one explicit
        `session.config`, from a controller, may still follow."""
        self._apply_config(proto.SessionConfig(), explicit=False)

    def _apply_config(self, config: proto.SessionConfig, *, explicit: bool) -> None:
        if not explicit and self.settings.turn_detection == "server_vad":
            config.turn_detection = proto.TurnDetection()
        if self.strict_reference:
            config.audio_events = True  # the reference's only way to return speech
        self.config = config
        self._server_vad = (
            ServerVad(config.turn_detection, self.talker.echo if self.talker is not None else None)
            if config.turn_detection is not None
            else None
        )
        self._explicit_config = explicit
        self._frames.max_frames = config.max_frames
        self._dc_filter = FrameSimilarityFilter(config.frame_filter_threshold) if config.enable_frame_filter else None
        self._track_filter = (
            FrameSimilarityFilter(config.track_filter_threshold) if config.enable_frame_filter else None
        )
        if self.state == "configuring":
            self.state = "active"
        self._open_engine_session(config)

    def _open_engine_session(self, config: proto.SessionConfig) -> None:
        """Engine session hook: an engine that follows sessions live (the remote engine) gets one
        per config, and from then on every buffered frame and, without server VAD, the audio."""
        if not isinstance(self.engine, LiveUnderstandEngine):
            return
        if self._engine_session is not None:
            self._tasks.spawn(self._engine_session.close())
        settings = LiveSettings(
            model=config.model,
            system_prompt=config.system_prompt,
            modalities=tuple(config.modalities),
            num_frames=config.num_frames,
            max_frames=config.max_frames,
            use_audio_in_video=config.use_audio_in_video,
            sampling_params_list=config.sampling_params_list,
            audio_streamed=self._server_vad is None,
        )
        self._engine_session = self.engine.open_session(self.session_id, settings)

    # ----------------------------------------------------------------- media in

    @property
    def media_sink(self) -> MediaSink:
        return self

    @property
    def has_output(self) -> bool:
        return self.talker is not None

    def drop_output(self) -> bool:
        self.talker = None  # speech only as audio events, if the client asks for them
        return True

    @property
    def sample_fps(self) -> float | None:
        return self.config.sample_fps if self.config is not None and self.state == "active" else None

    def note_frame_received(self) -> None:
        self.counters.frames_received += 1
        metrics.FRAMES.labels("received").inc()
        self._touch()

    async def _handle_dc_frame(self, msg: proto.FrameMessage) -> None:
        data = msg.data
        if data == "":
            return
        self.counters.frames_received += 1
        metrics.FRAMES.labels("received").inc()
        if data is None or len(data) > self.settings.max_frame_size:
            self._error(proto.INVALID_IMAGE_DATA if data is None else proto.FRAME_TOO_LARGE)
            return
        try:
            raw = base64.b64decode(data, validate=True)
            image = await asyncio.to_thread(open_image, raw, self.settings.max_image_pixels)
        except ImageTooLarge as exc:
            self._error(str(exc))
            return
        except (binascii.Error, ValueError, OSError, Image.DecompressionBombError):
            self._error(proto.INVALID_IMAGE_DATA)
            return
        self.counters.frames_sampled += 1
        metrics.FRAMES.labels("sampled").inc()
        frame = BufferedFrame(
            data=raw, **msg.echoed(), receiver_received_ts_ms=msg.received_ts_ms, decoded_ready_ts_ms=_now_ms()
        )
        try:
            retained = self._dc_filter is None or await asyncio.to_thread(self._dc_filter.should_retain, image)
        except (OSError, ValueError):
            self._error(proto.INVALID_IMAGE_DATA)
            return
        self._buffer_frame(frame, retained)

    async def add_track_frame(self, frame: av.VideoFrame, pts_ms: float | None, received_ts_ms: float) -> None:
        """A sampled camera frame: EVS, JPEG for the buffer (a filtered frame's only when a turn
        takes it), ack. Runs only for sampled frames."""
        if self.state != "active":
            return
        self.counters.frames_sampled += 1
        metrics.FRAMES.labels("sampled").inc()
        self._track_frame_seq += 1
        track_filter = self._track_filter

        def evaluate() -> tuple[bool, bytes]:
            keep = track_filter is None or track_filter.should_retain_thumbnail(
                frame_thumbnail(frame, track_filter.thumbnail_size)
            )
            return keep, frame_to_jpeg(frame, TRACK_JPEG_QUALITY) if keep else b""

        retained, jpeg = await asyncio.to_thread(evaluate)
        if self.state != "active":
            return
        buffered = BufferedFrame(
            data=jpeg,
            frame_id=f"rtp-{self._track_frame_seq}",
            pts_ms=None if pts_ms is None else round(pts_ms, 3),
            receiver_received_ts_ms=received_ts_ms,
            decoded_ready_ts_ms=_now_ms(),
        )
        self._latest_track_frame = _PendingFrame(buffered, buffered=retained, image=None if retained else frame)
        self._buffer_frame(buffered, retained)

    def _buffer_frame(self, frame: BufferedFrame, retained: bool) -> None:
        if not retained:
            self.counters.frames_filtered += 1
            metrics.FRAMES.labels("filtered").inc()
            self._ack(frame, accepted=False, reason="filtered")
            return
        evicted = self._frames.append(frame)
        if self._engine_session is not None:  # engine session hook
            self._engine_session.add_frame(frame.data)
        if evicted is not None:
            self.counters.frames_evicted += 1
        dropped_id = evicted.frame_id if evicted is not None and evicted.has_id else None
        self._ack(frame, accepted=True, dropped_frame_id=dropped_id)

    def _ack(
        self, frame: BufferedFrame, *, accepted: bool, reason: str | None = None, dropped_frame_id: Any = None
    ) -> None:
        if not frame.has_id:
            return
        ack = proto.FrameAck(
            frame_id=frame.frame_id,
            pts_ms=frame.pts_ms,
            capture_ts_ms=frame.capture_ts_ms,
            accepted=accepted,
            buffered_frames=len(self._frames),
            server_receive_ts_ms=frame.receiver_received_ts_ms or _now_ms(),
        )
        if reason is not None:
            ack.reason = "filtered"
        if dropped_frame_id is not None:
            ack.dropped_frame_id = dropped_frame_id
        self._emit(ack)

    def _append_audio(self, pcm16: bytes) -> None:
        metrics.AUDIO_MS_IN.inc(len(pcm16) / 32)
        if self._engine_session is not None and self._server_vad is None:  # engine session hook
            self._engine_session.add_audio(pcm16)
        if not self._audio.append(pcm16):
            self._error(proto.AUDIO_BUFFER_OVERFLOW)
        if self._server_vad is not None:
            for event in self._server_vad.feed(pcm16):
                self._on_turn_taking(event)

    def _on_turn_taking(self, event: SpeechStarted | SpeechStopped | EchoIgnored) -> None:
        """Server VAD: announce speech, barge in on the talker, and start a turn when speech ends."""
        assert self.config is not None and self.config.turn_detection is not None
        detection = self.config.turn_detection
        if isinstance(event, SpeechStarted):
            self._emit(proto.SpeechStartedEvent(audio_start_ms=event.audio_start_ms))
            if detection.interrupt_response and self._turn is not None:
                self._queue_work(BargeIn())
        elif isinstance(event, SpeechStopped):
            self._emit(proto.SpeechStoppedEvent(audio_end_ms=event.audio_end_ms))
            if not event.is_speech:
                self._audio.drop_until(event.audio_end_ms)
                return
            start = event.audio_start_ms - detection.prefix_padding_ms
            audio = self._audio.take_range(start, event.audio_end_ms)
            self._queue_work(VadTurn(audio, event.duration_ms))
        else:
            self._audio.drop_until(event.audio_end_ms)

    def add_track_audio(self, pcm16: bytes) -> None:
        if self.state != "active":
            return
        self._touch()
        self._append_audio(pcm16)

    # ----------------------------------------------------------------- turns

    async def _handle_query(self, msg: proto.QueryMessage) -> None:
        if msg.pcm:
            self._append_audio(msg.pcm)
        await self._start_turn(msg.text, audio=None, speech_ms=None)

    async def _start_turn(self, query: str, audio: bytes | None, speech_ms: float | None) -> None:
        """Interrupt any active turn, then answer from the buffers (or the given speech segment)."""
        await self._cancel_turn(notify=not self.strict_reference)
        if len(self._frames) == 0:
            self._error(proto.NO_FRAMES_BUFFERED)
            return
        turn = _Turn(request_id=f"video-{uuid.uuid4().hex[:12]}")
        frames, newest = self._turn_frames()
        audio = self._audio.take_all() if audio is None else audio
        self._turn = turn
        self.counters.turns_started += 1
        metrics.TURNS.labels("started").inc()
        turn.task = self._tasks.spawn(self._run_turn(turn, frames, newest, audio, query, speech_ms))

    def _turn_frames(self) -> tuple[list[BufferedFrame], _PendingFrame | None]:
        """The reference's sample of the buffer, and the filtered frame that stands in for its
        newest, if any: the newest camera frame is always current.

        EVS keeps near-duplicates out of the buffer, so on a still scene the newest buffered frame
        can be minutes old. When the newest sampled camera frame was filtered, it stands in for the
        newest buffered frame in this turn (EVS judged them alike), so the model's newest view is
        never older than one sampling interval. DataChannel frames are sampled exactly as upstream.
        """
        assert self.config is not None
        frames = self._frames.sample(self.config.num_frames)
        latest = self._latest_track_frame
        if latest is not None and not latest.buffered and frames and frames[-1].frame_id != latest.frame.frame_id:
            return frames, latest
        return frames, None

    async def _cancel_turn(self, *, notify: bool) -> None:
        """Interrupt the active turn: stop its text, flush its audio, abort its engine request."""
        turn, self._turn = self._turn, None
        if turn is None or turn.task is None or turn.task.done():
            return
        await self._cancel_task(turn.task)
        if self.talker is not None:
            self.talker.flush()
        if not turn.engine_finished:
            await self._abort_request(turn.request_id)
        self.counters.turns_cancelled += 1
        metrics.TURNS.labels("cancelled").inc()
        if notify:
            self._emit(proto.ResponseCancelled(request_id=turn.request_id))

    async def _newest_encoded(self, newest: _PendingFrame, buffered: BufferedFrame) -> BufferedFrame:
        """The filtered newest frame with its JPEG, or the buffer's newest if it cannot be encoded
        (the turn goes on with the frame EVS judged alike)."""
        try:
            return await newest.encoded()
        except ValueError as exc:
            logger.warning("session %s: the newest camera frame failed to encode: %s", self.session_id, exc)
            return buffered

    @staticmethod
    def _engine_frames(frames: list[BufferedFrame]) -> list[TurnFrame]:
        """The buffered JPEGs as the engine's frames, decoded only as far as the engine looks."""
        return [
            TurnFrame(
                frame_id=f.frame_id if f.has_id else None,
                pts_ms=f.pts_ms if isinstance(f.pts_ms, (int, float)) else None,
                jpeg=f.data,
            )
            for f in frames
        ]

    async def _run_turn(
        self,
        turn: _Turn,
        frames: list[BufferedFrame],
        newest: _PendingFrame | None,
        audio: bytes,
        query: str,
        speech_ms: float | None,
    ) -> None:
        assert self.config is not None
        config = self.config
        request_id = turn.request_id
        self._emit(proto.ResponseStart(request_id=request_id))
        audio_seen = False
        try:
            if newest is not None:
                frames[-1] = await self._newest_encoded(newest, frames[-1])
            turn_frames = self._engine_frames(frames)
            engine_turn = UnderstandTurn(
                request_id=request_id,
                frames=turn_frames,
                audio_pcm16=audio,
                query=query,
                history=list(self._history),
                system_prompt=config.system_prompt,
                modalities=tuple(config.modalities),
                speech_ms=speech_ms,
                model=config.model,
                use_audio_in_video=config.use_audio_in_video,
                sampling_params_list=config.sampling_params_list,
                engine_session=self._engine_session,
            )
            consumed_pending = any(f.has_id for f in frames)
            started = time.monotonic()
            async for output in stall_bounded(self.engine, engine_turn, self.settings.engine_stall_timeout):
                if consumed_pending:
                    consumed_pending = False
                    self._emit(self._frames_consumed(request_id, frames))
                if isinstance(output, TextDelta):
                    if not turn.text:
                        metrics.TIME_TO_FIRST_TEXT.observe(time.monotonic() - started)
                    turn.text += output.text
                    self._emit(proto.TextDeltaEvent(request_id=request_id, delta=output.text))
                elif isinstance(output, AudioChunk):
                    if not audio_seen:
                        metrics.TIME_TO_FIRST_AUDIO.observe(time.monotonic() - started)
                    audio_seen = True
                    if self.strict_reference and not turn.text_done_sent:
                        # The reference's quirk: text.done (text so far) at the first audio output.
                        turn.text_done_sent = True
                        self._emit(proto.TextDone(request_id=request_id, text=turn.text))
                    if config.audio_events:
                        data = wav_base64(float_to_pcm16(output.samples), TALKER_SAMPLE_RATE)
                        self._emit(proto.AudioDeltaEvent(request_id=request_id, data=data))
                    if self.talker is not None:
                        await self.talker.write(output.samples)
                elif isinstance(output, ContextLost):
                    self._emit(proto.ContextLost(request_id=request_id, message=output.reason))
            turn.engine_finished = True
        except asyncio.CancelledError:
            raise
        except TimeoutError:
            await self._fail_turn(turn, proto.ENGINE_STALLED)
            return
        except EngineError as exc:
            logger.warning("session %s: turn %s failed: %s", self.session_id, request_id, exc)
            await self._fail_turn(turn, proto.QUERY_PROCESSING_FAILED, detail=error_text(exc))
            return
        except Exception:
            logger.exception("session %s: turn %s failed", self.session_id, request_id)
            await self._fail_turn(turn, proto.QUERY_PROCESSING_FAILED)
            return

        if not turn.text_done_sent:
            turn.text_done_sent = True
            self._emit(proto.TextDone(request_id=request_id, text=turn.text))
        if audio_seen:
            if self.talker is not None:
                # The turn lasts until its speech has played out, so an interrupt can still cut it.
                await self.talker.wait_drained(timeout=self.settings.engine_stall_timeout)
            self._emit(proto.AudioDone(request_id=request_id))
        self._history.append({"role": "user", "content": query})
        self._history.append({"role": "assistant", "content": turn.text})
        self.counters.turns_completed += 1
        metrics.TURNS.labels("completed").inc()
        if self._turn is turn:
            self._turn = None

    async def _fail_turn(self, turn: _Turn, message: str, detail: str | None = None) -> None:
        self.counters.turns_failed += 1
        metrics.TURNS.labels("failed").inc()
        if self._turn is turn:
            self._turn = None
        if not turn.engine_finished:
            await self._abort_request(turn.request_id)
        self._error(message, request_id=turn.request_id, detail=detail)
        if not turn.text_done_sent:
            self._emit(proto.TextDone(request_id=turn.request_id, text=turn.text))

    def _frames_consumed(self, request_id: str, frames: list[BufferedFrame]) -> proto.FramesConsumed:
        return proto.FramesConsumed(
            request_id=request_id,
            model_selected_ts_ms=_now_ms(),
            frame_ids=[f.frame_id for f in frames if f.has_id],
            frames=[
                proto.ConsumedFrame(
                    frame_id=f.frame_id,
                    pts_ms=f.pts_ms,
                    source_pts_ms=f.source_pts_ms,
                    quality_profile=f.quality_profile,
                    receiver_received_ts_ms=f.receiver_received_ts_ms,
                    decoded_ready_ts_ms=f.decoded_ready_ts_ms,
                )
                for f in frames
            ],
            latest_pts_ms=frames[-1].pts_ms if frames else None,
        )

    async def _finish(self) -> None:
        """`video.done`: let the active turn finish (bounded), then `session.done` and close."""
        self.state = "finishing"
        turn = self._turn
        if turn is not None and turn.task is not None:
            done, _ = await asyncio.wait([turn.task], timeout=self.settings.engine_stall_timeout * 2)
            if not done:
                await self._cancel_turn(notify=True)
        self._emit(proto.SessionDone())
        self._close_soon()

    # ----------------------------------------------------------------- introspection

    def stats(self) -> dict[str, Any]:
        c = self.counters
        return {
            "kind": "understand",
            "state": self.state,
            "config_applied": self.config is not None,
            "frames_received": c.frames_received,
            "frames_sampled": c.frames_sampled,
            "frames_filtered": c.frames_filtered,
            "frames_buffered": len(self._frames),
            "frames_evicted": c.frames_evicted,
            "audio_ms_buffered": round(self._audio.duration_ms, 1),
            "turn_detection": self.config.turn_detection.type
            if self.config is not None and self.config.turn_detection is not None
            else None,
            "turns_started": c.turns_started,
            "turns_completed": c.turns_completed,
            "turns_cancelled": c.turns_cancelled,
            "turns_failed": c.turns_failed,
            "turn_active": self._turn is not None,
            "errors_sent": self.errors_sent,
        }
