"""The realtime session: the OpenAI Realtime API's conversation over the session skeleton.

A third session type beside understanding and generation (docs/realtime.md says why): the
conversation is a list of addressable items (sessions/conversation.py), a response is asked for
(`response.create`) rather than triggered by a query, and each response is given the earlier
items as history. It shares the skeleton's inbox, loop, clocks and close; the understanding
engine and its stall-bounded stream; the bounded 16 kHz audio buffer; and the `Talker`.
Events follow OpenAI's order: response.created, output_item.added, conversation.item.added,
content_part.added, the deltas, then the .done events from the innermost out, response.done last.
"""

from __future__ import annotations

import asyncio
import base64
import logging
from collections import deque
from contextlib import aclosing
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, Literal

import av
from PIL import Image
from pydantic import ValidationError

from .. import metrics
from ..engines.base import (
    INPUT_SAMPLE_RATE,
    TALKER_SAMPLE_RATE,
    AudioChunk,
    EngineError,
    TextDelta,
    Transcriber,
    TurnFrame,
    UnderstandEngine,
    Usage,
    transcriber_of,
)
from ..engines.base import UnderstandTurn as EngineTurn
from ..media.images import open_image
from ..media.pcm_resample import PcmStream, convert
from ..media.vad import SpeechStarted, SpeechStopped
from ..media.wav import float_to_pcm16
from ..protocol import realtime as proto
from ..protocol.codec import Refusal
from ..protocol.understand import MAX_AUDIO_BUFFER_BYTES, TurnDetection
from ..protocol.validation import describe_validation_error
from .audio_buffer import BYTES_PER_MS, AudioBuffer
from .base import Session
from .conversation import MAX_TURN_IMAGES, Conversation, Item, Part
from .engine_stream import stall_bounded
from .inbox import WorkItem
from .turn_taking import ServerVad, TurnTakingEvent
from .understand import Talker

if TYPE_CHECKING:
    from ..media.ingest import MediaSink

logger = logging.getLogger(__name__)

CAMERA_SAMPLE_FPS = 2.0  # a WebRTC camera, sampled as understanding sessions sample theirs
MAX_PENDING_TRANSCRIPTIONS = 4  # committed audio items waiting for the recogniser; more fail at once

SessionState = Literal["active", "closed"]
ResponseStatus = Literal["completed", "cancelled", "failed"]
CancelReason = Literal["client_cancelled", "turn_detected"]


@dataclass(frozen=True)
class TurnTaking(WorkItem):
    """The server VAD heard speech start or stop, or the talker's echo end."""

    name = "turn_taking"
    event: TurnTakingEvent


@dataclass
class _Response:
    id: str
    item: Item
    part: Part
    modality: str  # "text" or "audio"
    task: asyncio.Task[None] | None = None
    engine_finished: bool = False
    cancel_reason: CancelReason = "client_cancelled"
    speaking: bool = False  # its speech started on the talker track
    usage: Usage | None = None  # the engine's count, when it gives one


def _input_stream() -> PcmStream:
    """The client's 24 kHz audio/pcm as the 16 kHz the engines take."""
    return PcmStream(proto.PCM_RATE, INPUT_SAMPLE_RATE)


def _audio_ms(part: Part) -> float:
    """Milliseconds of an output_audio part's 24 kHz PCM16."""
    return len(part.audio) / (TALKER_SAMPLE_RATE * 2 / 1000)


def usage_wire(usage: Usage | None) -> dict[str, Any] | None:
    """The engine's count in the shape of OpenAI's RealtimeResponseUsage (what it does not count, null)."""
    if usage is None:
        return None
    return {
        "total_tokens": usage.input_tokens + usage.output_tokens,
        "input_tokens": usage.input_tokens,
        "output_tokens": usage.output_tokens,
        "input_token_details": {
            "text_tokens": usage.input_text_tokens,
            "audio_tokens": usage.input_audio_tokens,
            "image_tokens": usage.input_image_tokens,
            "cached_tokens": usage.input_cached_tokens,
        },
        "output_token_details": {"text_tokens": usage.output_text_tokens, "audio_tokens": usage.output_audio_tokens},
    }


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
        self.config, self._transcription_refused = self._honour_transcription(
            proto.SessionConfig().updated(self.initial_config or {})
        )
        self._conversation = Conversation()
        self._audio = AudioBuffer(MAX_AUDIO_BUFFER_BYTES)
        self._input = _input_stream()
        self._response: _Response | None = None
        self._vad = self._server_vad(self.config.audio.input.turn_detection)
        self._speech_item_id = ""  # the user item the current speech segment will become
        self._camera: deque[TurnFrame] = deque(maxlen=MAX_TURN_IMAGES)  # the newest sampled camera frames
        self.responses = {"completed": 0, "cancelled": 0, "failed": 0}

    def start(self) -> None:
        self._emit(proto.SessionCreated(session=self.config.to_wire()))
        if self._transcription_refused:
            self._transcription_unavailable(event_id=None)
        super().start()

    # ----------------------------------------------------------------- lifecycle

    async def _stop_work(self) -> None:
        self.state = "closed"
        response, self._response = self._response, None
        if response is not None and response.task is not None:
            await self._cancel_task(response.task)
            if not response.engine_finished:
                await self._abort_request(response.id)

    async def _release(self) -> None:
        self._audio.clear()
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
        if self._response is None and now - self._last_activity > self.settings.idle_timeout:
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
                self._audio.clear()
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
            self._error(text, code="invalid_value", event_id=message.event_id, param="session")
            return
        config, refused = self._honour_transcription(config)
        detection = config.audio.input.turn_detection
        if detection != self.config.audio.input.turn_detection:
            self._vad = self._server_vad(detection)
        self.config = config
        self._emit(proto.SessionUpdated(session=config.to_wire()))
        if refused:
            self._transcription_unavailable(message.event_id)

    def _honour_transcription(self, config: proto.SessionConfig) -> tuple[proto.SessionConfig, bool]:
        """Without a recogniser, asked-for transcription is reported off (null); True when so refused."""
        if config.audio.input.transcription is None or self._transcriber is not None:
            return config, False
        return config.updated({"audio": {"input": {"transcription": None}}}), True

    def _transcription_unavailable(self, event_id: str | None) -> None:
        self._error(
            proto.TRANSCRIPTION_UNAVAILABLE,
            code="transcription_unavailable",
            event_id=event_id,
            param="session.audio.input.transcription",
        )

    def _server_vad(self, detection: proto.TurnDetectionConfig | None) -> ServerVad | None:
        """The understanding sessions' server VAD and echo check, with this session's settings."""
        if detection is None:
            return None
        settings = TurnDetection(
            threshold=detection.threshold,
            prefix_padding_ms=detection.prefix_padding_ms,
            silence_duration_ms=detection.silence_ms,
            interrupt_response=detection.interrupt_response,
        )
        return ServerVad(settings, self.talker.echo if self.talker is not None else None)

    def _append_audio(self, pcm16: bytes, event_id: str | None = None) -> None:
        """16 kHz audio into the buffer and the server VAD, whose events the loop handles in turn."""
        metrics.AUDIO_MS_IN.inc(len(pcm16) / BYTES_PER_MS)
        if not self._audio.append(pcm16):
            self._error(proto.AUDIO_BUFFER_OVERFLOW, code="buffer_overflow", event_id=event_id)
        if self._vad is not None:
            for event in self._vad.feed(pcm16):
                self._queue_work(TurnTaking(event))

    async def _do(self, work: WorkItem) -> None:
        if isinstance(work, TurnTaking):
            await self._on_turn_taking(work.event)
        else:
            await super()._do(work)

    async def _on_turn_taking(self, event: TurnTakingEvent) -> None:
        """Server VAD: announce speech, interrupt the answer, commit the segment and answer it."""
        detection = self.config.audio.input.turn_detection
        if detection is None:  # turned off since the VAD heard it
            return
        if isinstance(event, SpeechStarted):
            self._speech_item_id = proto.new_id("item")
            self._emit(proto.SpeechStarted(audio_start_ms=int(event.audio_start_ms), item_id=self._speech_item_id))
            if detection.interrupt_response and self._response is not None:
                await self._interrupt(self._response, "turn_detected")
        elif isinstance(event, SpeechStopped):
            item_id = self._speech_item_id or proto.new_id("item")
            self._emit(proto.SpeechStopped(audio_end_ms=int(event.audio_end_ms), item_id=item_id))
            if not event.is_speech:
                self._audio.drop_until(event.audio_end_ms)
                return
            audio = self._audio.take_range(event.audio_start_ms - detection.prefix_padding_ms, event.audio_end_ms)
            self._commit(audio, item_id)
            if detection.create_response and self._response is None:
                await self._create_response(proto.ResponseParams(), event_id=None)
        else:  # the talker's own echo ended
            self._audio.drop_until(event.audio_end_ms)

    def _commit_audio(self, message: proto.AudioCommit) -> None:
        self._audio.append(self._input.flush())
        self._input = _input_stream()
        audio = self._audio.take_all()
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
        language = (self.config.audio.input.transcription or {}).get("language")
        stream = self._transcriber.transcribe(part.audio, language if isinstance(language, str) else None)
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
        seconds = round(len(part.audio) / BYTES_PER_MS / 1000, 3)
        self._emit(
            proto.TranscriptionCompleted(
                item_id=item.id, transcript=transcript, usage={"type": "duration", "seconds": seconds}
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
            self._error(
                f"Item with item_id '{item_in.id}' already exists", code="invalid_value", event_id=message.event_id
            )
            return
        parts: list[Part] = []
        for index, part in enumerate(item_in.content):
            stored = Part(type=part.type, text=part.text, transcript=part.transcript)
            if part.audio is not None and part.type == "input_audio":
                stored.audio = await asyncio.to_thread(convert, part.audio, proto.PCM_RATE, INPUT_SAMPLE_RATE)
            if part.image_url is not None:
                try:
                    await asyncio.to_thread(open_image, part.image_url, self.settings.max_image_pixels)
                except (OSError, ValueError, Image.DecompressionBombError) as exc:
                    param = f"item.content.{index}.image_url"
                    self._error(
                        f"The image could not be used: {exc}",
                        code="invalid_value",
                        event_id=message.event_id,
                        param=param,
                    )
                    return
                stored.image = part.image_url
            parts.append(stored)
        item = Item(id=item_in.id or proto.new_id("item"), role=item_in.role, parts=parts)
        try:
            previous = self._conversation.insert(item, message.previous_item_id)
        except KeyError:
            self._error(
                f"Previous item with item_id '{message.previous_item_id}' not found in the conversation",
                code="invalid_value",
                event_id=message.event_id,
                param="previous_item_id",
            )
            return
        self._announce(item, previous)

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
        self._emit(proto.ItemTruncated(item_id=item.id, content_index=index, audio_end_ms=audio_end_ms))

    # ----------------------------------------------------------------- responses

    async def _create_response(self, params: proto.ResponseParams, event_id: str | None) -> None:
        if self._response is not None:
            self._error(proto.ACTIVE_RESPONSE, code="conversation_already_has_active_response", event_id=event_id)
            return
        modality = (params.output_modalities or self.config.output_modalities)[0]
        instructions = params.instructions if params.instructions is not None else self.config.instructions
        context = self._conversation.context()
        frames = [TurnFrame(frame_id=None, pts_ms=None, jpeg=data) for data in context.images]  # checked on entry
        frames += self._camera  # the camera's newest view last
        part = Part(type="output_audio", transcript="") if modality == "audio" else Part(type="output_text", text="")
        item = Item(id=proto.new_id("item"), role="assistant", parts=[], status="in_progress")
        response = _Response(id=proto.new_id("resp"), item=item, part=part, modality=modality)
        turn = EngineTurn(
            request_id=response.id,
            frames=frames,
            audio_pcm16=context.audio,
            query=context.query,
            history=context.history,
            system_prompt=instructions or None,
            modalities=("text", "audio") if modality == "audio" else ("text",),
            model=self.config.model,
        )
        self._response = response
        self._emit(proto.ResponseCreated(response=self._response_wire(response, "in_progress")))
        self._emit(proto.OutputItemAdded(response_id=response.id, output_index=0, item=item.to_wire()))
        previous = self._conversation.insert(item)
        self._emit(proto.ItemAdded(item=item.to_wire(), previous_item_id=previous))
        item.parts.append(part)
        self._emit(proto.ContentPartAdded(response_id=response.id, item_id=item.id, part=self._part_wire(response)))
        response.task = self._tasks.spawn(self._run_response(response, turn))

    async def _run_response(self, response: _Response, turn: EngineTurn) -> None:
        ids = {"response_id": response.id, "item_id": response.item.id}
        part = response.part
        try:
            async for output in stall_bounded(self.engine, turn, self.settings.engine_stall_timeout):
                if isinstance(output, TextDelta):
                    if response.modality == "audio":
                        part.transcript = (part.transcript or "") + output.text
                        self._emit(proto.TranscriptDelta(**ids, delta=output.text))
                    else:
                        part.text = (part.text or "") + output.text
                        self._emit(proto.TextDelta(**ids, delta=output.text))
                elif isinstance(output, AudioChunk) and response.modality == "audio":
                    pcm16 = float_to_pcm16(output.samples)
                    if self.talker is not None:
                        if not response.speaking:
                            response.speaking = True
                            self._emit(proto.OutputAudioStarted(response_id=response.id))
                        await self.talker.write(output.samples)
                    else:
                        self._emit(proto.AudioDelta(**ids, delta=base64.b64encode(pcm16).decode("ascii")))
                    part.audio += pcm16  # what was sent: truncation cuts it to what was heard
                elif isinstance(output, Usage):
                    response.usage = output
            response.engine_finished = True
            if self.talker is not None and response.speaking:
                # The response lasts until its speech has played out, so an interrupt can still cut it.
                await self.talker.wait_drained(timeout=self.settings.engine_stall_timeout)
                self._emit(proto.OutputAudioStopped(response_id=response.id))
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # the response fails; the session goes on
            message = proto.ENGINE_STALLED if isinstance(exc, TimeoutError) else proto.RESPONSE_FAILED
            if isinstance(exc, EngineError):
                message = f"{message}: {exc}"
            logger.warning("session %s: response %s failed: %r", self.session_id, response.id, exc)
            if not response.engine_finished:
                await self._abort_request(response.id)
            self._finish_response(response, "failed", error=message)
            return
        self._finish_response(response, "completed")

    async def _cancel_response(self, message: proto.ResponseCancel) -> None:
        response = self._response
        if response is None or (message.response_id is not None and message.response_id != response.id):
            self._error(proto.NO_ACTIVE_RESPONSE, code="response_cancel_not_active", event_id=message.event_id)
            return
        await self._interrupt(response, "client_cancelled")

    async def _interrupt(self, response: _Response, reason: CancelReason) -> None:
        """Stop the response's text, flush its speech, abort its engine request; it ends cancelled.
        Over WebRTC its item is then cut to the speech the peer was sent (`conversation.item.truncated`)."""
        response.cancel_reason = reason
        if response.task is not None:
            await self._cancel_task(response.task)
        unplayed_ms = 0.0
        if self.talker is not None and response.speaking:
            unplayed_ms = self.talker.flush()
            self._emit(proto.OutputAudioCleared(response_id=response.id))
        if not response.engine_finished:
            await self._abort_request(response.id)
        self._finish_response(response, "cancelled")
        if response.speaking and self._conversation.get(response.item.id) is not None:
            self._cut(response.item, 0, max(0, int(_audio_ms(response.part) - unplayed_ms)))

    async def _clear_output_audio(self, message: proto.OutputAudioClear) -> None:
        if self.talker is None:
            self._error(proto.OUTPUT_AUDIO_CLEAR_WEBRTC_ONLY, code="invalid_value", event_id=message.event_id)
        elif self._response is not None and self._response.speaking:
            await self._interrupt(self._response, "client_cancelled")
        else:
            self.talker.flush()  # nothing of a response left to clear: no event

    def _finish_response(self, response: _Response, status: ResponseStatus, error: str | None = None) -> None:
        """The .done events, innermost first, whatever ended the response; the item keeps what was said."""
        if self._response is not response:
            return
        self._response = None
        self.responses[status] += 1
        metrics.TURNS.labels(status).inc()
        ids = {"response_id": response.id, "item_id": response.item.id}
        if response.modality == "audio":
            self._emit(proto.AudioDone(**ids))
            self._emit(proto.TranscriptDone(**ids, transcript=response.part.transcript or ""))
        else:
            self._emit(proto.TextDone(**ids, text=response.part.text or ""))
        self._emit(proto.ContentPartDone(**ids, part=self._part_wire(response)))
        response.item.status = "completed" if status == "completed" else "incomplete"
        item = response.item.to_wire()
        self._emit(proto.OutputItemDone(response_id=response.id, output_index=0, item=item))
        if self._conversation.get(response.item.id) is not None:
            self._emit(proto.ItemDone(item=item, previous_item_id=self._previous_id(response.item)))
        self._emit(proto.ResponseDone(response=self._response_wire(response, status, error=error)))

    def _previous_id(self, item: Item) -> str | None:
        items = list(self._conversation)
        position = items.index(item)
        return items[position - 1].id if position > 0 else None

    def _part_wire(self, response: _Response) -> dict[str, Any]:
        part = response.part
        if response.modality == "audio":
            return {"type": "audio", "transcript": part.transcript or ""}
        return {"type": "text", "text": part.text or ""}

    def _response_wire(self, response: _Response, status: str, error: str | None = None) -> dict[str, Any]:
        wire: dict[str, Any] = {
            "id": response.id,
            "object": "realtime.response",
            "status": status,
            "status_details": None,
            "output": [] if status == "in_progress" else [response.item.to_wire()],
            "output_modalities": [response.modality],
            "conversation_id": None,
            "usage": None if status == "in_progress" else usage_wire(response.usage),
        }
        if status == "cancelled":
            wire["status_details"] = {"type": "cancelled", "reason": response.cancel_reason}
        elif status == "failed":
            wire["status_details"] = {"type": "failed", "error": {"type": proto.SERVER_ERROR, "message": error}}
        return wire

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
        self._touch()

    async def add_track_frame(self, frame: av.VideoFrame, pts_ms: float | None, received_ts_ms: float) -> None:
        """A sampled camera frame: the newest few go with each response, after the pinned images."""
        rgb = await asyncio.to_thread(frame.to_ndarray, format="rgb24")
        self._camera.append(TurnFrame(frame_id=None, pts_ms=pts_ms, pixels=rgb))

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
            "audio_ms_buffered": round(self._audio.duration_ms, 1),
            "camera_frames": len(self._camera),
            "response_active": self._response is not None,
            "responses": dict(self.responses),
            "errors_sent": self.errors_sent,
        }
