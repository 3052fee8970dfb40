"""The realtime session: the OpenAI Realtime API's conversation over the session skeleton.

A third session type beside understanding and generation (docs/realtime.md says why): the
conversation is a list of addressable items (sessions/conversation.py), a response is asked for
(`response.create`) rather than triggered by a query, and each response is given the earlier
items as history. It shares the skeleton's inbox, loop, clocks and close, and with understanding
sessions the spoken answer (answer.py), the listening path (listening.py) and the camera path
(camera.py); the understanding engine answers both.
A response's events and output items are realtime_response.py's; this module decides when
responses run: one at a time in the conversation (a second asked for while the first only plays
out waits for it, so a tool's result never cuts into speech), out-of-band ones beside it, and no
automatic response while a tool call waits for its output.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter
from contextlib import aclosing
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, Literal

import av
from PIL import Image
from pydantic import ValidationError

from ..engines.engine import (
    ConversationMirror,
    EngineError,
    EngineSession,
    ForcedTool,
    FunctionArguments,
    FunctionCallStarted,
    FunctionTool,
    LiveSettings,
    LiveUnderstandEngine,
    ToolChoice,
    Transcriber,
    TurnFrame,
    UnderstandEngine,
    UnderstandTurn,
    calls_tools,
    transcriber_of,
)
from ..media import denoise
from ..media.images import open_image
from ..media.pcm_resample import PcmStream, convert
from ..media.vad import SpeechStarted, SpeechStopped
from ..pcm import INPUT_BYTES_PER_MS, INPUT_SAMPLE_RATE, TALKER_SAMPLE_RATE, pcm16_ms
from ..protocol import realtime_events as proto
from ..protocol.codec import Refusal
from ..protocol.validation import describe_validation_error, field_path
from .answer import Answer, Failure, Outcome
from .camera import Camera, engine_frames
from .conversation import MAX_TURN_IMAGES, Context, Conversation, Item, Part, context_of
from .end_of_turn import fallback_silence_ms
from .idle_prompt import IdleTimeout
from .inbox import WorkItem
from .listening import Heard, Listening
from .outputs import Talker
from .realtime_response import CancelReason, EndStatus, RealtimeResponse
from .session import Session
from .turn_taking import EchoIgnored, TurnTakingEvent, vad_settings

if TYPE_CHECKING:
    from ..media.ingest import MediaSink

logger = logging.getLogger(__name__)

CAMERA_SAMPLE_FPS = 2.0  # a WebRTC camera, sampled as understanding sessions sample theirs
MAX_PENDING_TRANSCRIPTIONS = 4  # committed audio items waiting for the recogniser; more fail at once
MAX_OUT_OF_BAND_RESPONSES = 4  # out-of-band responses running beside the conversation's at once
# How long a function call's output is waited for before the user's speech gets its automatic
# response anyway: an app that never answers a call must not leave the assistant silent for good.
TOOL_OUTPUT_WAIT_S = 30.0

SessionState = Literal["active", "closed"]
InputField = Literal["transcription", "noise_reduction"]


@dataclass(frozen=True)
class _Deferred(WorkItem):
    """A response asked for while the conversation's last one was still playing out: queued for
    the loop when that one ends."""

    params: proto.ResponseParams
    event_id: str | None
    name = "deferred response"


def _input_stream() -> PcmStream:
    """The client's 24 kHz audio/pcm as the 16 kHz the engines take."""
    return PcmStream(proto.PCM_RATE, INPUT_SAMPLE_RATE)


def _audio_ms(part: Part) -> float:
    """Milliseconds of an output_audio part's 24 kHz PCM16."""
    return pcm16_ms(part.audio, TALKER_SAMPLE_RATE)


def engine_tools(tools: list[proto.FunctionToolIn]) -> tuple[FunctionTool, ...]:
    return tuple(FunctionTool(tool.name, tool.description, tool.parameters) for tool in tools)


def engine_choice(choice: proto.ToolChoiceIn) -> ToolChoice:
    return ForcedTool(choice.name) if isinstance(choice, proto.ToolChoiceFunction) else choice


@dataclass(kw_only=True)
class RealtimeSession(Session[proto.ClientMessage | proto.InvalidEvent, UnderstandEngine]):
    """One OpenAI Realtime conversation."""

    kind: ClassVar[str] = "realtime"
    max_messages: ClassVar[int] = 200
    binary_refusal: ClassVar[Refusal] = proto.BINARY_REFUSAL

    talker: Talker | None = None
    initial_config: dict[str, Any] | None = None  # validated by the caller (proto.SessionConfig.updated)
    state: SessionState = "active"

    def __post_init__(self) -> None:
        super().__post_init__()
        self._transcriber: Transcriber | None = None
        if self.settings.transcriber != "none":
            self._transcriber = transcriber_of(self.engine)
        self._transcriptions: asyncio.Queue[Item] = asyncio.Queue(MAX_PENDING_TRANSCRIPTIONS)
        self._transcribing: asyncio.Task[None] | None = None
        self.config, self._inputs_refused = self._honour_inputs(
            proto.SessionConfig().updated(self.initial_config or {})
        )
        self.config, self._tools_refused = self._honour_tools(self.config)
        self.config, self._semantic_refused = self._honour_turn_detection(self.config)
        self._conversation = Conversation()
        self._listening = Listening(self._queue_work, self._tasks.spawn)
        self._detect(self.config.audio.input.turn_detection)
        self._suppress_noise(self.config.audio.input.noise_reduction)
        self._input = _input_stream()
        self._response: RealtimeResponse | None = None  # the conversation's, at most one
        self._out_of_band: dict[str, RealtimeResponse] = {}
        self._deferred: _Deferred | None = None
        self._awaiting: dict[str, float] = {}  # call_id -> when the call was made, until its output comes
        self._conversation_id = proto.new_id("conv")
        self._speech_item_id = ""  # the user item the current speech segment will become
        self._camera = Camera(MAX_TURN_IMAGES)  # the newest sampled camera frames go with each response
        self._camera.filter_track(True)
        self.responses: Counter[Outcome] = Counter()
        self._engine_session = self._open_engine_session()

    def _open_engine_session(self) -> EngineSession | None:
        """Engine session hook: an engine that follows sessions (the remote engine) keeps the
        conversation's responses in one upstream session, its items mirrored by id."""
        if not isinstance(self.engine, LiveUnderstandEngine):
            return None
        settings = LiveSettings(
            model=self.config.model,
            system_prompt=self.config.instructions or None,
            modalities=tuple(self.config.output_modalities),
            num_frames=MAX_TURN_IMAGES,
            max_frames=MAX_TURN_IMAGES,
            use_audio_in_video=False,
            sampling_params_list=None,
            audio_streamed=False,
            realtime=True,
        )
        return self.engine.open_session(self.session_id, settings)

    def start(self) -> None:
        self._emit(proto.SessionCreated(session=self.config.to_wire()))
        for field in self._inputs_refused:
            self._input_unavailable(field, event_id=None)
        if self._tools_refused:
            self._tools_unavailable("session.tools", event_id=None)
        if self._semantic_refused:
            self._semantic_vad_unavailable(event_id=None)
        super().start()

    # ----------------------------------------------------------------- lifecycle

    async def _stop_work(self) -> None:
        self.state = "closed"
        self._deferred = None
        responses = [*self._out_of_band.values(), *([self._response] if self._response is not None else [])]
        self._response = None
        self._out_of_band.clear()
        for response in responses:
            await response.answer.interrupt()
        if self._engine_session is not None:
            await self._engine_session.close()

    async def _release(self) -> None:
        self._listening.audio.clear()
        self._camera.clear()
        self._conversation.clear()

    def _error(
        self,
        message: str,
        *,
        code: str | None = None,
        event_id: str | None = None,
        param: str | None = None,
        error_type: str = proto.INVALID_REQUEST,
    ) -> None:
        detail = proto.ErrorDetail(type=error_type, code=code, message=message, param=param, event_id=event_id)
        self._emit(proto.ErrorEvent(error=detail))

    def _watch_period(self) -> float:
        return min(1.0, self.settings.idle_timeout / 4)

    async def _check_clocks(self, now: float) -> bool:
        """Idle: no client event or media for --idle-timeout while no response is running."""
        running = self._response is not None or self._out_of_band
        if not running and now - self._last_activity > self.settings.idle_timeout:
            self._error(proto.IDLE_TIMEOUT, code="idle_timeout")
            self._close_soon()
            return True
        return False

    # ----------------------------------------------------------------- client events

    def _decode(self, raw: str) -> proto.ClientMessage | proto.InvalidEvent | Refusal:
        return proto.decode(raw)

    async def _handle(self, message: proto.ClientMessage | proto.InvalidEvent) -> bool:
        match message:
            case proto.InvalidEvent():
                self._error(message.message, code="invalid_value", event_id=message.event_id, param=message.param)
            case proto.SessionUpdate():
                self._update_session(message)
            case proto.AudioAppend():
                self._append_audio(self._input.feed(message.audio), message.event_id)
            case proto.AudioCommit():
                self._commit_audio(message)
            case proto.AudioClear():
                self._listening.audio.clear()
                self._input = _input_stream()
                self._emit(proto.AudioCleared())
            case proto.ItemCreate():
                await self._create_item(message)
            case proto.ItemRetrieve():
                item = self._item(message.item_id, message.event_id)
                if item is not None:
                    self._emit(proto.ItemRetrieved(item=item.to_wire()))
            case proto.ItemDelete():
                if self._conversation.delete(message.item_id):
                    self._emit(proto.ItemDeleted(item_id=message.item_id))
                else:
                    self._item_not_found(message.item_id, message.event_id)
            case proto.ItemTruncate():
                self._truncate(message)
            case proto.ResponseCreate():
                await self._create_response(message.response, message.event_id)
            case proto.ResponseCancel():
                await self._cancel_response(message)
            case proto.OutputAudioClear():
                await self._clear_output_audio(message)
        return False

    def _update_session(self, message: proto.SessionUpdate) -> None:
        try:
            config = self.config.updated(message.session)
        except ValidationError as exc:
            text = f"Invalid session: {describe_validation_error(exc)}"
            loc = proto.without_tags(exc.errors()[0]["loc"])
            param = ".".join(["session", field_path(loc)]) if loc else "session"
            self._error(text, code="invalid_value", event_id=message.event_id, param=param)
            return
        config, inputs_refused = self._honour_inputs(config)
        config, tools_refused = self._honour_tools(config)
        config, semantic_refused = self._honour_turn_detection(config)
        detection = config.audio.input.turn_detection
        if detection != self.config.audio.input.turn_detection:
            self._detect(detection)
        self._suppress_noise(config.audio.input.noise_reduction)
        self.config = config
        self._emit(proto.SessionUpdated(session=config.to_wire()))
        for field in inputs_refused:
            self._input_unavailable(field, message.event_id)
        if tools_refused:
            self._tools_unavailable("session.tools", message.event_id)
        if semantic_refused:
            self._semantic_vad_unavailable(message.event_id)

    def _honour_inputs(self, config: proto.SessionConfig) -> tuple[proto.SessionConfig, list[InputField]]:
        """Input processing asked for that this server cannot give (no recogniser for its engine, no RNNoise
        installed) is reported off (null); the fields so refused."""
        able: dict[InputField, bool] = {
            "transcription": self._transcriber is not None,
            "noise_reduction": denoise.available(),
        }
        refused = [field for field, ok in able.items() if not ok and getattr(config.audio.input, field) is not None]
        if refused:
            config = config.updated({"audio": {"input": dict.fromkeys(refused)}})
        return config, refused

    def _honour_tools(self, config: proto.SessionConfig) -> tuple[proto.SessionConfig, bool]:
        """An engine that calls no tools gets none: they are reported empty; True when so refused."""
        if not config.tools or calls_tools(self.engine):
            return config, False
        return config.updated({"tools": [], "tool_choice": "auto"}), True

    def _honour_turn_detection(self, config: proto.SessionConfig) -> tuple[proto.SessionConfig, bool]:
        """Without the end-of-turn model, semantic_vad is reported as the server_vad it falls back to
        (the silence its eagerness stands for); True when so refused."""
        silence = fallback_silence_ms(config.audio.input.turn_detection, self.settings.end_of_turn_model)
        if silence is None:
            return config, False
        fallback = {"type": "server_vad", "silence_duration_ms": silence}
        return config.updated({"audio": {"input": {"turn_detection": fallback}}}), True

    def _tools_unavailable(self, param: str, event_id: str | None) -> None:
        self._error(proto.TOOLS_UNAVAILABLE, code="tools_unavailable", event_id=event_id, param=param)

    def _semantic_vad_unavailable(self, event_id: str | None) -> None:
        param = "session.audio.input.turn_detection.type"
        self._error(proto.SEMANTIC_VAD_UNAVAILABLE, code="semantic_vad_unavailable", event_id=event_id, param=param)

    def _input_unavailable(self, field: InputField, event_id: str | None) -> None:
        message = proto.TRANSCRIPTION_UNAVAILABLE if field == "transcription" else proto.NOISE_REDUCTION_UNAVAILABLE
        self._error(message, code=f"{field}_unavailable", event_id=event_id, param=f"session.audio.input.{field}")

    def _detect(self, detection: proto.TurnDetectionConfig | None) -> None:
        """The listening path's turn detection, with this session's settings."""
        echo = self.talker.echo if self.talker is not None else None
        self._listening.detect(vad_settings(detection, self.settings.min_interruption_ms), echo)

    def _suppress_noise(self, noise_reduction: proto.NoiseReductionConfig | None) -> None:
        self._listening.suppress_noise(noise_reduction.strength if noise_reduction is not None else None)

    def _append_audio(self, pcm16: bytes, event_id: str | None = None) -> None:
        """16 kHz audio into the listening path, whose events the loop handles in turn."""
        if not self._listening.hear(pcm16):
            self._error(proto.AUDIO_BUFFER_OVERFLOW, code="buffer_overflow", event_id=event_id)

    async def _do(self, work: WorkItem) -> None:
        if isinstance(work, Heard):
            await self._on_heard(work.event)
        elif isinstance(work, _Deferred):
            await self._create_response(work.params, work.event_id)
        else:
            await super()._do(work)

    async def _on_heard(self, event: TurnTakingEvent | IdleTimeout) -> None:
        """Server VAD: announce speech, interrupt the answer, commit the utterance and answer it."""
        detection = self.config.audio.input.turn_detection
        if detection is None:  # turned off since the VAD heard it
            return
        if isinstance(event, IdleTimeout):
            await self._prompt(event)
            return
        if isinstance(event, SpeechStarted):
            self._speech_item_id = proto.new_id("item")
            self._emit(proto.SpeechStarted(audio_start_ms=int(event.audio_start_ms), item_id=self._speech_item_id))
        response = self._response
        barge_in = self._listening.barge_in(event, answering=response is not None)
        if response is not None and barge_in == "interrupt":
            await self._interrupt(response, "turn_detected")
        elif response is not None and barge_in is not None:
            response.answer.judged(hold=barge_in == "hold")
        if not isinstance(event, SpeechStopped | EchoIgnored):
            return
        item_id = self._speech_item_id or proto.new_id("item")
        if isinstance(event, SpeechStopped):
            self._emit(proto.SpeechStopped(audio_end_ms=int(event.audio_end_ms), item_id=item_id))
        utterance = self._listening.utterance(event)
        if utterance is None:
            return
        self._commit(utterance, item_id)
        if detection.create_response and self._response is None and not self._tool_running():
            await self._create_response(proto.ResponseParams(), event_id=None)

    async def _prompt(self, timeout: IdleTimeout) -> None:
        """The user stayed silent for idle_timeout_ms: OpenAI's `timeout_triggered`, the silence committed
        as their item, and a response, unless one runs or a tool's output is awaited."""
        if self._response is not None or self._tool_running():
            return
        item_id = proto.new_id("item")
        start_ms, end_ms = int(timeout.audio_start_ms), int(timeout.audio_end_ms)
        self._emit(proto.TimeoutTriggered(audio_start_ms=start_ms, audio_end_ms=end_ms, item_id=item_id))
        self._commit(self._listening.silence(timeout), item_id)
        await self._create_response(proto.ResponseParams(), event_id=None)

    def _tool_running(self) -> bool:
        """A call of the conversation's waits for its output (not longer than TOOL_OUTPUT_WAIT_S):
        the app's response.create after the output answers the user's speech too."""
        now = time.monotonic()
        self._awaiting = {call: made for call, made in self._awaiting.items() if now - made < TOOL_OUTPUT_WAIT_S}
        return bool(self._awaiting)

    def _commit_audio(self, message: proto.AudioCommit) -> None:
        self._listening.audio.append(self._input.flush())
        self._input = _input_stream()
        audio = self._listening.audio.take_all()
        if not audio:
            self._error(proto.AUDIO_BUFFER_EMPTY, code="input_audio_buffer_commit_empty", event_id=message.event_id)
            return
        self._commit(audio, proto.new_id("item"))

    def _commit(self, audio: bytes, item_id: str) -> None:
        """The audio becomes a user item at the end of the conversation."""
        item = Item(id=item_id, role="user", parts=[Part(type="input_audio", audio=audio)])
        previous = self._conversation.insert(item)
        self._emit(proto.AudioCommitted(item_id=item.id, previous_item_id=previous))
        self._announce(item, previous)
        if self.config.audio.input.transcription is not None:
            self._queue_transcription(item)

    # ----------------------------------------------------------------- input transcription

    def _queue_transcription(self, item: Item) -> None:
        """The recogniser takes committed items one at a time, in order, beside the responses."""
        try:
            self._transcriptions.put_nowait(item)
        except asyncio.QueueFull:
            self._transcription_failed(item, proto.TRANSCRIPTION_BACKLOG)
            return
        if self._transcribing is None:
            self._transcribing = self._tasks.spawn(self._transcribe_items())

    async def _transcribe_items(self) -> None:
        while True:
            await self._transcribe(await self._transcriptions.get())

    async def _transcribe(self, item: Item) -> None:
        """Deltas as the recogniser writes them, then the transcript, kept on the item as its history."""
        assert self._transcriber is not None  # nothing is queued without one
        part = item.parts[0]
        transcription = self.config.audio.input.transcription
        stream = self._transcriber.transcribe(part.audio, transcription.language if transcription else None)
        transcript = ""
        try:
            async with asyncio.timeout(self.settings.engine_stall_timeout), aclosing(stream):
                async for delta in stream:
                    transcript += delta
                    self._emit(proto.TranscriptionDelta(item_id=item.id, delta=delta))
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # the item stays without a transcript; the session goes on
            logger.warning("session %s: transcribing %s failed: %r", self.session_id, item.id, exc)
            reason = proto.ENGINE_STALLED if isinstance(exc, TimeoutError) else "Transcription failed"
            self._transcription_failed(item, f"{reason}: {exc}" if isinstance(exc, EngineError) else reason)
            return
        part.transcript = transcript
        seconds = round(len(part.audio) / INPUT_BYTES_PER_MS / 1000, 3)
        self._emit(
            proto.TranscriptionCompleted(
                item_id=item.id, transcript=transcript, usage=proto.DurationUsage(seconds=seconds)
            )
        )

    def _transcription_failed(self, item: Item, message: str) -> None:
        error = proto.ErrorDetail(type=proto.SERVER_ERROR, code="transcription_failed", message=message)
        self._emit(proto.TranscriptionFailed(item_id=item.id, error=error))

    def _announce(self, item: Item, previous: str | None) -> None:
        self._emit(proto.ItemAdded(item=item.to_wire(), previous_item_id=previous))
        self._emit(proto.ItemDone(item=item.to_wire(), previous_item_id=previous))

    async def _create_item(self, message: proto.ItemCreate) -> None:
        item_in = message.item
        if item_in.id is not None and self._conversation.get(item_in.id) is not None:
            self._error(proto.item_exists(item_in.id), code="invalid_value", event_id=message.event_id)
            return
        if not self._call_fits(item_in, message.event_id):
            return
        item = await self._stored(item_in, message.event_id, "item")
        if item is None:
            return
        try:
            previous = self._conversation.insert(item, message.previous_item_id)
        except KeyError:
            self._error(
                proto.previous_item_not_found(str(message.previous_item_id)),
                code="invalid_value",
                event_id=message.event_id,
                param="previous_item_id",
            )
            return
        if item.type == "function_call_output":
            self._awaiting.pop(item.call_id, None)
        self._announce(item, previous)

    def _call_fits(self, item_in: proto.ItemIn, event_id: str | None) -> bool:
        """A call's id is new to the conversation; an output answers a call of it, once."""
        if isinstance(item_in, proto.FunctionCallIn) and item_in.call_id is not None:
            if self._conversation.call(item_in.call_id) is not None:
                self._error(
                    proto.about_call(proto.CALL_EXISTS, item_in.call_id),
                    code="invalid_value",
                    event_id=event_id,
                    param="item.call_id",
                )
                return False
        if isinstance(item_in, proto.FunctionCallOutputIn):
            problem = None
            if self._conversation.call(item_in.call_id) is None:
                problem = proto.about_call(proto.CALL_UNKNOWN, item_in.call_id)
            elif self._conversation.call(item_in.call_id, "function_call_output") is not None:
                problem = proto.about_call(proto.CALL_ANSWERED, item_in.call_id)
            if problem is not None:
                self._error(problem, code="invalid_value", event_id=event_id, param="item.call_id")
                return False
        return True

    async def _stored(self, item_in: proto.ItemIn, event_id: str | None, param: str) -> Item | None:
        """A client's item as the conversation keeps it: audio at 16 kHz, images checked (an error
        naming `param`'s part and None when one cannot be used)."""
        item_id = item_in.id or proto.new_id("item")
        if isinstance(item_in, proto.FunctionCallIn):
            call_id = item_in.call_id or proto.new_id("call")
            return Item(
                id=item_id, type="function_call", call_id=call_id, name=item_in.name, arguments=item_in.arguments
            )
        if isinstance(item_in, proto.FunctionCallOutputIn):
            return Item(id=item_id, type="function_call_output", call_id=item_in.call_id, output=item_in.output)
        parts: list[Part] = []
        for index, part in enumerate(item_in.content):
            stored = Part(type=part.type, text=part.text, transcript=part.transcript)
            if part.audio is not None and part.type == "input_audio":
                stored.audio = await asyncio.to_thread(convert, part.audio, proto.PCM_RATE, INPUT_SAMPLE_RATE)
            if part.image_url is not None:
                try:
                    await asyncio.to_thread(open_image, part.image_url, self.settings.max_image_pixels)
                except (OSError, ValueError, Image.DecompressionBombError) as exc:
                    self._error(
                        f"The image could not be used: {exc}",
                        code="invalid_value",
                        event_id=event_id,
                        param=f"{param}.content.{index}.image_url",
                    )
                    return None
                stored.image = part.image_url
            parts.append(stored)
        return Item(id=item_id, role=item_in.role, parts=parts)

    def _item(self, item_id: str, event_id: str | None) -> Item | None:
        item = self._conversation.get(item_id)
        if item is None:
            self._item_not_found(item_id, event_id)
        return item

    def _item_not_found(self, item_id: str, event_id: str | None) -> None:
        self._error(proto.item_not_found(item_id), code="item_not_found", event_id=event_id, param="item_id")

    def _truncate(self, message: proto.ItemTruncate) -> None:
        """Cut an assistant audio part to what the user heard; its transcript keeps the same share."""
        item = self._item(message.item_id, message.event_id)
        if item is None:
            return
        index = message.content_index
        part = item.parts[index] if item.role == "assistant" and index < len(item.parts) else None
        if part is None or part.type != "output_audio":
            self._error(
                "Only an assistant message's output_audio part can be truncated",
                code="invalid_value",
                event_id=message.event_id,
                param="content_index",
            )
            return
        sent_ms = _audio_ms(part)
        if message.audio_end_ms > sent_ms:
            self._error(
                f"audio_end_ms {message.audio_end_ms} is longer than the audio ({sent_ms:.0f} ms)",
                code="invalid_value",
                event_id=message.event_id,
                param="audio_end_ms",
            )
            return
        self._cut(item, index, message.audio_end_ms)

    def _cut(self, item: Item, index: int, audio_end_ms: int) -> None:
        """Keep an output_audio part's first `audio_end_ms` and the same share of its transcript's words."""
        part = item.parts[index]
        sent_ms = _audio_ms(part)
        words = (part.transcript or "").split()
        kept = round(len(words) * audio_end_ms / sent_ms) if sent_ms else 0
        part.transcript = " ".join(words[:kept])
        part.audio = part.audio[: int(audio_end_ms * TALKER_SAMPLE_RATE / 1000) * 2]
        if isinstance(self._engine_session, ConversationMirror):
            self._engine_session.truncate(item.id, audio_end_ms, part.transcript)
        self._emit(proto.ItemTruncated(item_id=item.id, content_index=index, audio_end_ms=audio_end_ms))

    # ----------------------------------------------------------------- responses

    async def _create_response(self, params: proto.ResponseParams, event_id: str | None) -> None:
        out_of_band = params.conversation == "none"
        if not out_of_band and self._response is not None:
            if self._response.answer.engine_finished and self._deferred is None:
                self._deferred = _Deferred(params, event_id)  # it starts once the speech has played out
            else:
                self._error(proto.ACTIVE_RESPONSE, code="conversation_already_has_active_response", event_id=event_id)
            return
        if out_of_band and len(self._out_of_band) >= MAX_OUT_OF_BAND_RESPONSES:
            self._error(proto.PARALLEL_RESPONSES, code="rate_limit_exceeded", event_id=event_id)
            return
        context = self._conversation.context() if params.input is None else await self._input_context(params, event_id)
        if context is None:
            return
        modality = (params.output_modalities or self.config.output_modalities)[0]
        instructions = params.instructions if params.instructions is not None else self.config.instructions
        tools = params.tools if params.tools is not None else self.config.tools
        choice = params.tool_choice or (self.config.tool_choice if params.tools is None else "auto")
        problem = proto.choice_problem(tools, choice)
        if problem is not None:
            self._error(f"tool_choice {problem}", code="invalid_value", event_id=event_id, param="response.tool_choice")
            return
        if tools and not calls_tools(self.engine):
            self._tools_unavailable("response.tools", event_id)
            tools, choice = [], "auto"
        pinned = [TurnFrame(frame_id=None, pts_ms=None, jpeg=data) for data in context.images]  # checked on entry
        answer = Answer(
            proto.new_id("resp"),
            session_id=self.session_id,
            engine=self.engine,
            talker=self.talker if modality == "audio" and not out_of_band else None,
            events=self,
            abort=self._abort_request,
            stall_timeout=self.settings.engine_stall_timeout,
            tally=self.responses,
        )
        response = RealtimeResponse(
            answer,
            modality=modality,
            emit=self._emit,
            conversation=None if out_of_band else self._conversation,
            conversation_id=None if out_of_band else self._conversation_id,
            metadata=params.metadata,
        )
        model = self.config.model

        async def build() -> UnderstandTurn:
            camera = engine_frames(await self._camera.turn_frames(MAX_TURN_IMAGES))  # its newest view last
            return UnderstandTurn(
                request_id=answer.request_id,
                frames=pinned + camera,
                audio_pcm16=context.audio,
                query=context.query,
                history=context.history,
                system_prompt=instructions or None,
                modalities=("text", "audio") if modality == "audio" else ("text",),
                model=model,
                tools=engine_tools(tools),
                tool_choice=engine_choice(choice),
                # An out-of-band response is computed apart from the conversation the engine follows.
                engine_session=None if out_of_band else self._engine_session,
                history_ids=context.history_ids,
                input_ids=context.input_ids,
                output_id=response.message_id,
            )

        if out_of_band:
            self._out_of_band[response.id] = response
        else:
            self._response = response
            self._listening.busy()
        self._emit(proto.ResponseCreated(response=response.wire("in_progress")))
        answer.start(self._tasks.spawn, build)

    async def _input_context(self, params: proto.ResponseParams, event_id: str | None) -> Context | None:
        """A response's own `input`: new items and references to the conversation's, in order."""
        items: list[Item] = []
        for index, item_in in enumerate(params.input or []):
            if isinstance(item_in, proto.ItemReference):
                found = self._conversation.get(item_in.id)
                if found is None:
                    param = f"response.input.{index}.id"
                    self._error(proto.item_not_found(item_in.id), code="item_not_found", event_id=event_id, param=param)
                    return None
                items.append(found)
                continue
            stored = await self._stored(item_in, event_id, f"response.input.{index}")
            if stored is None:
                return None
            items.append(stored)
        return context_of(items)

    # ----------------------------------------------------------------- the answer's events

    def _response_of(self, answer: Answer) -> RealtimeResponse:
        response = self._response if self._response is not None and self._response.answer is answer else None
        response = response or self._out_of_band.get(answer.request_id)
        assert response is not None and response.answer is answer, "an ended response's answer went on"
        return response

    def on_first_output(self, answer: Answer) -> None:
        pass

    def on_text(self, answer: Answer, delta: str) -> None:
        self._response_of(answer).text(delta)

    def on_audio(self, answer: Answer, pcm16: bytes, first: bool) -> None:
        self._response_of(answer).audio(pcm16, first)

    def on_function_call(self, answer: Answer, output: FunctionCallStarted | FunctionArguments) -> None:
        response = self._response_of(answer)
        if isinstance(output, FunctionCallStarted):
            response.call_started(output.call_id, output.name)
        else:
            response.arguments(output.call_id, output.delta)

    def on_context_lost(self, answer: Answer, reason: str) -> None:
        pass  # OpenAI's protocol has no such event: the conversation's items are the context

    def on_generated(self, answer: Answer) -> None:
        self._response_of(answer).generated()

    def on_completed(self, answer: Answer) -> None:
        response = self._response_of(answer)
        if answer.speaking:
            self._emit(proto.OutputAudioStopped(response_id=response.id))
        self._finish_response(response, "completed")

    def on_failed(self, answer: Answer, failure: Failure) -> None:
        message = proto.ENGINE_STALLED if failure.kind == "stalled" else proto.RESPONSE_FAILED
        if failure.detail is not None:
            message = f"{message}: {failure.detail}"
        self._finish_response(self._response_of(answer), "failed", error=message)

    async def _cancel_response(self, message: proto.ResponseCancel) -> None:
        response = self._response
        if message.response_id is not None:
            named = self._out_of_band.get(message.response_id)
            response = named or (response if response is not None and response.id == message.response_id else None)
        if response is None:
            self._error(proto.NO_ACTIVE_RESPONSE, code="response_cancel_not_active", event_id=message.event_id)
            return
        await self._interrupt(response, "client_cancelled")

    async def _interrupt(self, response: RealtimeResponse, reason: CancelReason) -> None:
        """Stop the response's text, flush its speech, abort its engine request; it ends cancelled.
        Over WebRTC its message is then cut to the speech the peer was sent (`conversation.item.truncated`)."""
        response.cancel_reason = reason
        unplayed_ms = await response.answer.interrupt()
        if unplayed_ms is None:  # it had ended
            return
        speaking = response.answer.speaking
        if speaking:
            self._emit(proto.OutputAudioCleared(response_id=response.id))
        self._finish_response(response, "cancelled")
        spoken = response.message
        if speaking and spoken is not None and self._conversation.get(spoken.id) is not None:
            self._cut(spoken, 0, max(0, int(_audio_ms(spoken.parts[0]) - unplayed_ms)))

    async def _clear_output_audio(self, message: proto.OutputAudioClear) -> None:
        if self.talker is None:
            self._error(proto.OUTPUT_AUDIO_CLEAR_WEBRTC_ONLY, code="invalid_value", event_id=message.event_id)
        elif self._response is not None and self._response.answer.speaking:
            await self._interrupt(self._response, "client_cancelled")
        else:
            self.talker.flush()  # nothing of a response left to clear: no event

    def _finish_response(self, response: RealtimeResponse, status: EndStatus, error: str | None = None) -> None:
        """`response.done`, whatever ended the response; then a response asked for while it played out."""
        if response.ended:
            return
        if response.out_of_band:
            self._out_of_band.pop(response.id, None)
        elif self._response is response:
            self._response = None
            self._listening.answered(response.answer.playback_left_ms if status == "completed" else 0.0)
            now = time.monotonic()
            self._awaiting.update({call.call_id: now for call in response.calls})
        response.finish(status, error)
        deferred, self._deferred = self._deferred, None
        if deferred is None or response.out_of_band:
            self._deferred = deferred
        elif status == "cancelled" and response.cancel_reason == "turn_detected":
            # The user spoke over it: answering now would talk over them; their turn's response will
            # see what the deferred one would have (a tool's output is in the conversation).
            logger.info("session %s: a deferred response.create gave way to the user's turn", self.session_id)
        else:
            self._queue_work(deferred)

    # ----------------------------------------------------------------- media in (WebRTC)

    @property
    def media_sink(self) -> MediaSink:
        return self

    @property
    def has_output(self) -> bool:
        return self.talker is not None

    def drop_output(self) -> bool:
        self.talker = None  # a peer without an audio m-line gets speech as output_audio events
        return True

    @property
    def sample_fps(self) -> float | None:
        return CAMERA_SAMPLE_FPS if self.state == "active" else None

    def note_frame_received(self) -> None:
        self._camera.note_received()
        self._touch()

    async def add_track_frame(self, frame: av.VideoFrame, pts_ms: float | None, received_ts_ms: float) -> None:
        """A sampled camera frame through the camera path: the newest few go with each response."""
        if self.state != "active":
            return
        buffered, retained = await self._camera.judge_track_frame(frame, pts_ms, received_ts_ms)
        if self.state == "active":
            self._camera.buffer(buffered, retained)

    def add_track_audio(self, pcm16: bytes) -> None:
        """The microphone, already 16 kHz: the same buffer and VAD as input_audio_buffer.append."""
        if self.state == "active":
            self._touch()
            self._append_audio(pcm16)

    # ----------------------------------------------------------------- introspection

    def stats(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "state": self.state,
            "items": len(self._conversation),
            "conversation_bytes": self._conversation.held_bytes,
            "audio_ms_buffered": round(self._listening.audio.duration_ms, 1),
            "camera_frames": len(self._camera.frames),
            "frames_received": self._camera.counters.received,
            "frames_sampled": self._camera.counters.sampled,
            "frames_filtered": self._camera.counters.filtered,
            "response_active": self._response is not None,
            "responses": {outcome: self.responses[outcome] for outcome in ("completed", "cancelled", "failed")},
            "errors_sent": self.errors_sent,
        }
