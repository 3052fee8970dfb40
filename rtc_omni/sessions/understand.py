"""The understanding session: one live conversation about what the camera sees and the mic hears.

A state machine over the session skeleton (session.py), transport-agnostic: it takes control
messages parsed by protocol/understand_messages.py, sampled camera frames and 16 kHz audio (the
`MediaSink` side), and emits events through `send`. It owns the protocol of vLLM-Omni's
`/v1/video/chat/stream`: config first, DataChannel frames and acks, turns, interrupts,
`video.done`, and the timeouts around them; the spoken answer, the listening path and the camera
path it shares with realtime sessions (answer.py, listening.py, camera.py).
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import uuid
from collections import Counter, deque
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, Literal

import av
from PIL import Image

from ..engines.engine import (
    EngineSession,
    FunctionArguments,
    FunctionCallStarted,
    LiveSettings,
    LiveUnderstandEngine,
    UnderstandEngine,
    UnderstandTurn,
)
from ..media import denoise
from ..media.evs import FrameSimilarityFilter
from ..media.images import ImageTooLarge, open_image
from ..media.vad import SpeechStarted, SpeechStopped
from ..media.wav import wav_base64
from ..pcm import TALKER_SAMPLE_RATE
from ..protocol import understand_messages as proto
from ..protocol.codec import Refusal
from .answer import Answer, Failure, Outcome
from .camera import Camera, engine_frames, now_ms
from .end_of_turn import fallback_silence_ms
from .frame_buffer import BufferedFrame
from .idle_prompt import IdleTimeout
from .inbox import WorkItem
from .listening import Heard, Listening
from .outputs import Talker
from .session import Session
from .turn_taking import EchoIgnored, TurnTakingEvent, vad_settings

if TYPE_CHECKING:
    from ..media.ingest import MediaSink

MAX_HISTORY_MESSAGES = 16

SessionState = Literal["configuring", "active", "finishing", "closed"]


def _history_ids(request_id: str) -> tuple[str, str]:
    """The ids of a turn's question and answer in the history."""
    return f"{request_id}.question", f"{request_id}.answer"


@dataclass
class _Turn:
    answer: Answer
    query: str
    frames: list[BufferedFrame] = field(default_factory=list)  # what the engine was given
    text_done_sent: bool = False


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
    turns: Counter[Outcome] = field(default_factory=Counter)  # by outcome

    def __post_init__(self) -> None:
        super().__post_init__()
        self._explicit_config = False
        self._config_queued = False  # judge what follows a queued config as the config's processor will
        self._camera = Camera(50)
        self._dc_filter: FrameSimilarityFilter | None = None
        self._listening = Listening(self._queue_work, self._tasks.spawn)
        # (id, chat message): an engine that mirrors the conversation upstream knows each by its id.
        self._history: deque[tuple[str, dict[str, Any]]] = deque(maxlen=MAX_HISTORY_MESSAGES)
        self._turn: _Turn | None = None
        self._engine_session: EngineSession | None = None  # engine-side state, for engines that keep one

    # ----------------------------------------------------------------- lifecycle

    async def _stop_work(self) -> None:
        self.state = "closed"
        await self._cancel_turn(notify=False)
        if self._engine_session is not None:  # engine session hook (remote engine)
            await self._engine_session.close()

    async def _release(self) -> None:
        self._camera.clear()
        self._listening.audio.clear()
        self._history.clear()

    def _error(
        self, message: str, request_id: str | None = None, detail: str | None = None, code: str | None = None
    ) -> None:
        event = proto.ErrorEvent(message=message)
        if request_id is not None:
            event.request_id = request_id
        if detail is not None:
            event.detail = detail
        if code is not None:
            event.code = code
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
        if isinstance(work, Heard):
            await self._on_heard(work.event)
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
        if not explicit and self.settings.turn_detection != "none":
            config.turn_detection = proto.TurnDetection(type=self.settings.turn_detection)
        if not explicit and self.settings.noise_reduction != "none":
            config.noise_reduction = proto.NoiseReduction(type=self.settings.noise_reduction)
        if self.strict_reference:
            config.audio_events = True  # the reference's only way to return speech
        if config.noise_reduction is not None and not denoise.available():
            config.noise_reduction = None
            self._error(proto.NOISE_REDUCTION_UNAVAILABLE, detail=proto.NOISE_REDUCTION_HINT)
        detection = config.turn_detection
        silence = fallback_silence_ms(detection, self.settings.end_of_turn_model)
        if detection is not None and silence is not None:
            detection = detection.model_copy(update={"type": "server_vad", "silence_duration_ms": silence})
            config.turn_detection = detection
            self._error(proto.SEMANTIC_VAD_UNAVAILABLE, detail=proto.SEMANTIC_VAD_HINT, code="semantic_vad_unavailable")
        self.config = config
        echo = self.talker.echo if self.talker is not None else None
        self._listening.detect(vad_settings(detection, self.settings.min_interruption_ms), echo)
        self._listening.suppress_noise(config.noise_reduction.strength if config.noise_reduction else None)
        self._explicit_config = explicit
        self._camera.frames.max_frames = config.max_frames
        self._dc_filter = FrameSimilarityFilter(config.frame_filter_threshold) if config.enable_frame_filter else None
        self._camera.filter_track(config.enable_frame_filter, config.track_filter_threshold)
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
            audio_streamed=self._listening.detection is None,
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
        self._camera.note_received()
        self._touch()

    async def _handle_dc_frame(self, msg: proto.FrameMessage) -> None:
        data = msg.data
        if data == "":
            return
        self._camera.note_received()
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
        self._camera.note_sampled()
        frame = BufferedFrame(
            data=raw, **msg.echoed(), receiver_received_ts_ms=msg.received_ts_ms, decoded_ready_ts_ms=now_ms()
        )
        try:
            retained = self._dc_filter is None or await asyncio.to_thread(self._dc_filter.should_retain, image)
        except (OSError, ValueError):
            self._error(proto.INVALID_IMAGE_DATA)
            return
        self._buffer_frame(frame, retained)

    async def add_track_frame(self, frame: av.VideoFrame, pts_ms: float | None, received_ts_ms: float) -> None:
        """A sampled camera frame through the camera path, then acked. Runs only for sampled frames."""
        if self.state != "active":
            return
        buffered, retained = await self._camera.judge_track_frame(frame, pts_ms, received_ts_ms)
        if self.state == "active":
            self._buffer_frame(buffered, retained)

    def _buffer_frame(self, frame: BufferedFrame, retained: bool) -> None:
        evicted = self._camera.buffer(frame, retained)
        if not retained:
            self._ack(frame, accepted=False, reason="filtered")
            return
        if self._engine_session is not None:  # engine session hook
            self._engine_session.add_frame(frame.data)
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
            buffered_frames=len(self._camera.frames),
            server_receive_ts_ms=frame.receiver_received_ts_ms or now_ms(),
        )
        if reason is not None:
            ack.reason = "filtered"
        if dropped_frame_id is not None:
            ack.dropped_frame_id = dropped_frame_id
        self._emit(ack)

    def _append_audio(self, pcm16: bytes) -> None:
        if self._engine_session is not None and self._listening.detection is None:  # engine session hook
            self._engine_session.add_audio(pcm16)
        if not self._listening.hear(pcm16):
            self._error(proto.AUDIO_BUFFER_OVERFLOW)

    async def _on_heard(self, event: TurnTakingEvent | IdleTimeout) -> None:
        """Server VAD: announce speech, barge in on the talker, and answer the utterance it ends; after
        `idle_timeout_ms` of silence, answer that silence."""
        if self._listening.detection is None:
            return
        if isinstance(event, IdleTimeout):
            if self._turn is None:
                self._emit(
                    proto.TimeoutTriggeredEvent(audio_start_ms=event.audio_start_ms, audio_end_ms=event.audio_end_ms)
                )
                await self._start_turn("", audio=self._listening.silence(event), speech_ms=None)
            return
        if isinstance(event, SpeechStarted):
            self._emit(proto.SpeechStartedEvent(audio_start_ms=event.audio_start_ms))
        turn = self._turn
        barge_in = self._listening.barge_in(event, answering=turn is not None)
        if turn is not None and barge_in == "interrupt":
            await self._cancel_turn(notify=True)
        elif turn is not None and barge_in is not None:
            turn.answer.judged(hold=barge_in == "hold")
        if not isinstance(event, SpeechStopped | EchoIgnored):
            return
        if isinstance(event, SpeechStopped):
            self._emit(proto.SpeechStoppedEvent(audio_end_ms=event.audio_end_ms))
        utterance = self._listening.utterance(event)
        if utterance is not None and isinstance(event, SpeechStopped):
            await self._start_turn("", audio=utterance, speech_ms=event.duration_ms)

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
        if len(self._camera.frames) == 0:
            self._error(proto.NO_FRAMES_BUFFERED)
            return
        assert self.config is not None
        config = self.config
        answer = Answer(
            f"video-{uuid.uuid4().hex[:12]}",
            session_id=self.session_id,
            engine=self.engine,
            talker=self.talker,
            events=self,
            abort=self._abort_request,
            stall_timeout=self.settings.engine_stall_timeout,
            tally=self.turns,
        )
        turn = _Turn(answer, query)
        audio = self._listening.audio.take_all() if audio is None else audio
        history = list(self._history)
        question, reply = _history_ids(answer.request_id)

        async def build() -> UnderstandTurn:
            turn.frames = await self._camera.turn_frames(config.num_frames)
            return UnderstandTurn(
                request_id=answer.request_id,
                frames=engine_frames(turn.frames),
                audio_pcm16=audio,
                query=query,
                history=[message for _, message in history],
                history_ids=tuple(item_id for item_id, _ in history),
                input_ids=(question,),
                output_id=reply,
                system_prompt=config.system_prompt,
                modalities=tuple(config.modalities),
                speech_ms=speech_ms,
                model=config.model,
                use_audio_in_video=config.use_audio_in_video,
                sampling_params_list=config.sampling_params_list,
                engine_session=self._engine_session,
            )

        self._turn = turn
        self._listening.busy()
        self._emit(proto.ResponseStart(request_id=answer.request_id))
        answer.start(self._tasks.spawn, build)

    async def _cancel_turn(self, *, notify: bool) -> None:
        """Interrupt the active turn: stop its text, flush its audio, abort its engine request."""
        turn, self._turn = self._turn, None
        if turn is None or await turn.answer.interrupt() is None:
            return
        self._listening.answered(0.0)
        if notify:
            self._emit(proto.ResponseCancelled(request_id=turn.answer.request_id))

    # ----------------------------------------------------------------- the answer's events

    def _turn_of(self, answer: Answer) -> _Turn:
        assert self._turn is not None and self._turn.answer is answer, "an ended turn's answer went on"
        return self._turn

    def on_first_output(self, answer: Answer) -> None:
        frames = self._turn_of(answer).frames
        if any(f.has_id for f in frames):
            self._emit(self._frames_consumed(answer.request_id, frames))

    def on_text(self, answer: Answer, delta: str) -> None:
        self._emit(proto.TextDeltaEvent(request_id=answer.request_id, delta=delta))

    def on_audio(self, answer: Answer, pcm16: bytes, first: bool) -> None:
        turn = self._turn_of(answer)
        if self.strict_reference and not turn.text_done_sent:
            # The reference's quirk: text.done (text so far) at the first audio output.
            self._text_done(turn)
        assert self.config is not None
        if self.config.audio_events:
            data = wav_base64(pcm16, TALKER_SAMPLE_RATE)
            self._emit(proto.AudioDeltaEvent(request_id=answer.request_id, data=data))

    def on_function_call(self, answer: Answer, output: FunctionCallStarted | FunctionArguments) -> None:
        pass  # vLLM-Omni's understanding protocol declares no tools, so its turns offer none

    def on_context_lost(self, answer: Answer, reason: str) -> None:
        self._emit(proto.ContextLost(request_id=answer.request_id, message=reason))

    def on_generated(self, answer: Answer) -> None:
        turn = self._turn_of(answer)
        if not turn.text_done_sent:
            self._text_done(turn)

    def on_completed(self, answer: Answer) -> None:
        turn = self._turn_of(answer)
        if answer.audio_seen:
            self._emit(proto.AudioDone(request_id=answer.request_id))
        question, reply = _history_ids(answer.request_id)
        self._history.append((question, {"role": "user", "content": turn.query}))
        self._history.append((reply, {"role": "assistant", "content": answer.text}))
        self._turn = None
        assert self.config is not None
        self._listening.answered(answer.playback_left_ms if self.config.audio_events else 0.0)

    def on_failed(self, answer: Answer, failure: Failure) -> None:
        turn = self._turn_of(answer)
        self._turn = None
        self._listening.answered(0.0)
        message = proto.ENGINE_STALLED if failure.kind == "stalled" else proto.QUERY_PROCESSING_FAILED
        self._error(message, request_id=answer.request_id, detail=failure.detail)
        if not turn.text_done_sent:
            self._text_done(turn)

    def _text_done(self, turn: _Turn) -> None:
        turn.text_done_sent = True
        self._emit(proto.TextDone(request_id=turn.answer.request_id, text=turn.answer.text))

    def _frames_consumed(self, request_id: str, frames: list[BufferedFrame]) -> proto.FramesConsumed:
        return proto.FramesConsumed(
            request_id=request_id,
            model_selected_ts_ms=now_ms(),
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
        if turn is not None and not await turn.answer.wait(self.settings.engine_stall_timeout * 2):
            await self._cancel_turn(notify=True)
        self._emit(proto.SessionDone())
        self._close_soon()

    # ----------------------------------------------------------------- introspection

    def stats(self) -> dict[str, Any]:
        turns, camera = self.turns, self._camera.counters
        return {
            "kind": "understand",
            "state": self.state,
            "config_applied": self.config is not None,
            "frames_received": camera.received,
            "frames_sampled": camera.sampled,
            "frames_filtered": camera.filtered,
            "frames_buffered": len(self._camera.frames),
            "frames_evicted": camera.evicted,
            "audio_ms_buffered": round(self._listening.audio.duration_ms, 1),
            "turn_detection": self.config.turn_detection.type
            if self.config is not None and self.config.turn_detection is not None
            else None,
            "turns_started": turns["started"],
            "turns_completed": turns["completed"],
            "turns_cancelled": turns["cancelled"],
            "turns_failed": turns["failed"],
            "turn_active": self._turn is not None,
            "errors_sent": self.errors_sent,
        }
