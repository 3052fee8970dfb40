"""The realtime session: the OpenAI Realtime API's conversation over the session skeleton.

A third session type beside understanding and generation (docs/realtime.md says why): the
conversation is a list of addressable items (sessions/conversation.py), a response is asked for
(`response.create`) rather than triggered by a query, and each response is given the earlier
items as history. It shares the skeleton's inbox, loop, clocks and close, and with understanding
sessions the spoken answer (answer.py), the listening path (listening.py) and the camera path
(camera.py); the understanding engine answers both.
Events follow OpenAI's order: response.created, output_item.added, conversation.item.added,
content_part.added, the deltas, then the .done events from the innermost out, response.done last.
"""

from __future__ import annotations

import asyncio
import base64
import logging
from collections import Counter
from contextlib import aclosing
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, Literal

import av
from PIL import Image
from pydantic import ValidationError

from ..engines.engine import (
    EngineError,
    Transcriber,
    TurnFrame,
    UnderstandEngine,
    UnderstandTurn,
    Usage,
    transcriber_of,
)
from ..media.images import open_image
from ..media.pcm_resample import PcmStream, convert
from ..media.vad import SpeechStarted, SpeechStopped
from ..pcm import INPUT_BYTES_PER_MS, INPUT_SAMPLE_RATE, TALKER_SAMPLE_RATE, pcm16_ms
from ..protocol import realtime_events as proto
from ..protocol.codec import Refusal
from ..protocol.validation import describe_validation_error
from .answer import Answer, Failure, Outcome
from .camera import Camera, engine_frames
from .conversation import MAX_TURN_IMAGES, Conversation, Item, Part
from .inbox import WorkItem
from .listening import Heard, Listening
from .outputs import Talker
from .session import Session
from .turn_taking import TurnTakingEvent, VadSettings

if TYPE_CHECKING:
    from ..media.ingest import MediaSink

logger = logging.getLogger(__name__)

CAMERA_SAMPLE_FPS = 2.0  # a WebRTC camera, sampled as understanding sessions sample theirs
MAX_PENDING_TRANSCRIPTIONS = 4  # committed audio items waiting for the recogniser; more fail at once

SessionState = Literal["active", "closed"]
ResponseStatus = Literal["in_progress", "completed", "cancelled", "failed"]
EndStatus = Literal["completed", "cancelled", "failed"]
CancelReason = Literal["client_cancelled", "turn_detected"]


@dataclass
class _Response:
    answer: Answer
    item: Item
    part: Part
    modality: Literal["text", "audio"]
    cancel_reason: CancelReason = "client_cancelled"

    @property
    def id(self) -> str:
        return self.answer.request_id


def _input_stream() -> PcmStream:
    """The client's 24 kHz audio/pcm as the 16 kHz the engines take."""
    return PcmStream(proto.PCM_RATE, INPUT_SAMPLE_RATE)


def _audio_ms(part: Part) -> float:
    """Milliseconds of an output_audio part's 24 kHz PCM16."""
    return pcm16_ms(part.audio, TALKER_SAMPLE_RATE)


def usage_wire(usage: Usage | None) -> proto.ResponseUsage | None:
    """The engine's count in the shape of OpenAI's RealtimeResponseUsage (what it does not count, null)."""
    if usage is None:
        return None
    return proto.ResponseUsage(
        total_tokens=usage.input_tokens + usage.output_tokens,
        input_tokens=usage.input_tokens,
        output_tokens=usage.output_tokens,
        input_token_details=proto.InputTokenDetails(
            text_tokens=usage.input_text_tokens,
            audio_tokens=usage.input_audio_tokens,
            image_tokens=usage.input_image_tokens,
            cached_tokens=usage.input_cached_tokens,
        ),
        output_token_details=proto.OutputTokenDetails(
            text_tokens=usage.output_text_tokens, audio_tokens=usage.output_audio_tokens
        ),
    )


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
        self._listening = Listening(self._queue_work)
        self._detect(self.config.audio.input.turn_detection)
        self._input = _input_stream()
        self._response: _Response | None = None
        self._speech_item_id = ""  # the user item the current speech segment will become
        self._camera = Camera(MAX_TURN_IMAGES)  # the newest sampled camera frames go with each response
        self._camera.filter_track(True)
        self.responses: Counter[Outcome] = Counter()

    def start(self) -> None:
        self._emit(proto.SessionCreated(session=self.config.to_wire()))
        if self._transcription_refused:
            self._transcription_unavailable(event_id=None)
        super().start()

    # ----------------------------------------------------------------- lifecycle

    async def _stop_work(self) -> None:
        self.state = "closed"
        response, self._response = self._response, None
        if response is not None:
            await response.answer.interrupt()

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
            self._error(text, code="invalid_value", event_id=message.event_id, param="session")
            return
        config, refused = self._honour_transcription(config)
        detection = config.audio.input.turn_detection
        if detection != self.config.audio.input.turn_detection:
            self._detect(detection)
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

    def _detect(self, detection: proto.TurnDetectionConfig | None) -> None:
        """The listening path's turn detection, with this session's settings."""
        settings = (
            None
            if detection is None
            else VadSettings(
                detection.threshold, detection.prefix_padding_ms, detection.silence_ms, detection.interrupt_response
            )
        )
        self._listening.detect(settings, self.talker.echo if self.talker is not None else None)

    def _append_audio(self, pcm16: bytes, event_id: str | None = None) -> None:
        """16 kHz audio into the listening path, whose events the loop handles in turn."""
        if not self._listening.hear(pcm16):
            self._error(proto.AUDIO_BUFFER_OVERFLOW, code="buffer_overflow", event_id=event_id)

    async def _do(self, work: WorkItem) -> None:
        if isinstance(work, Heard):
            await self._on_heard(work.event)
        else:
            await super()._do(work)

    async def _on_heard(self, event: TurnTakingEvent) -> None:
        """Server VAD: announce speech, interrupt the answer, commit the utterance and answer it."""
        detection = self.config.audio.input.turn_detection
        if detection is None:  # turned off since the VAD heard it
            return
        if isinstance(event, SpeechStarted):
            self._speech_item_id = proto.new_id("item")
            self._emit(proto.SpeechStarted(audio_start_ms=int(event.audio_start_ms), item_id=self._speech_item_id))
            if self._listening.barges_in(event) and self._response is not None:
                await self._interrupt(self._response, "turn_detected")
            return
        item_id = self._speech_item_id or proto.new_id("item")
        if isinstance(event, SpeechStopped):
            self._emit(proto.SpeechStopped(audio_end_ms=int(event.audio_end_ms), item_id=item_id))
        utterance = self._listening.utterance(event)
        if utterance is None:
            return
        self._commit(utterance, item_id)
        if detection.create_response and self._response is None:
            await self._create_response(proto.ResponseParams(), event_id=None)

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
                proto.previous_item_not_found(str(message.previous_item_id)),
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
        pinned = [TurnFrame(frame_id=None, pts_ms=None, jpeg=data) for data in context.images]  # checked on entry
        part = Part(type="output_audio", transcript="") if modality == "audio" else Part(type="output_text", text="")
        item = Item(id=proto.new_id("item"), role="assistant", parts=[], status="in_progress")
        answer = Answer(
            proto.new_id("resp"),
            session_id=self.session_id,
            engine=self.engine,
            talker=self.talker if modality == "audio" else None,
            events=self,
            abort=self._abort_request,
            stall_timeout=self.settings.engine_stall_timeout,
            tally=self.responses,
        )
        response = _Response(answer, item=item, part=part, modality=modality)
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
            )

        self._response = response
        self._emit(proto.ResponseCreated(response=self._response_wire(response, "in_progress")))
        self._emit(proto.OutputItemAdded(response_id=response.id, output_index=0, item=item.to_wire()))
        previous = self._conversation.insert(item)
        self._emit(proto.ItemAdded(item=item.to_wire(), previous_item_id=previous))
        item.parts.append(part)
        self._emit(proto.ContentPartAdded(response_id=response.id, item_id=item.id, part=self._part_wire(response)))
        answer.start(self._tasks.spawn, build)

    # ----------------------------------------------------------------- the answer's events

    def _response_of(self, answer: Answer) -> _Response:
        assert self._response is not None and self._response.answer is answer, "an ended response's answer went on"
        return self._response

    def on_first_output(self, answer: Answer) -> None:
        pass

    def on_text(self, answer: Answer, delta: str) -> None:
        response = self._response_of(answer)
        ids = {"response_id": response.id, "item_id": response.item.id}
        if response.modality == "audio":
            response.part.transcript = (response.part.transcript or "") + delta
            self._emit(proto.TranscriptDelta(**ids, delta=delta))
        else:
            response.part.text = (response.part.text or "") + delta
            self._emit(proto.TextDelta(**ids, delta=delta))

    def on_audio(self, answer: Answer, pcm16: bytes, first: bool) -> None:
        response = self._response_of(answer)
        if response.modality != "audio":
            return
        if answer.talker is None:
            delta = base64.b64encode(pcm16).decode("ascii")
            self._emit(proto.AudioDelta(response_id=response.id, item_id=response.item.id, delta=delta))
        elif first:
            self._emit(proto.OutputAudioStarted(response_id=response.id))
        response.part.audio += pcm16  # what was sent: truncation cuts it to what was heard

    def on_context_lost(self, answer: Answer, reason: str) -> None:
        pass  # OpenAI's protocol has no such event: the conversation's items are the context

    def on_generated(self, answer: Answer) -> None:
        pass

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
        if response is None or (message.response_id is not None and message.response_id != response.id):
            self._error(proto.NO_ACTIVE_RESPONSE, code="response_cancel_not_active", event_id=message.event_id)
            return
        await self._interrupt(response, "client_cancelled")

    async def _interrupt(self, response: _Response, reason: CancelReason) -> None:
        """Stop the response's text, flush its speech, abort its engine request; it ends cancelled.
        Over WebRTC its item is then cut to the speech the peer was sent (`conversation.item.truncated`)."""
        response.cancel_reason = reason
        unplayed_ms = await response.answer.interrupt()
        if unplayed_ms is None:  # it had ended
            return
        speaking = response.answer.speaking
        if speaking:
            self._emit(proto.OutputAudioCleared(response_id=response.id))
        self._finish_response(response, "cancelled")
        if speaking and self._conversation.get(response.item.id) is not None:
            self._cut(response.item, 0, max(0, int(_audio_ms(response.part) - unplayed_ms)))

    async def _clear_output_audio(self, message: proto.OutputAudioClear) -> None:
        if self.talker is None:
            self._error(proto.OUTPUT_AUDIO_CLEAR_WEBRTC_ONLY, code="invalid_value", event_id=message.event_id)
        elif self._response is not None and self._response.answer.speaking:
            await self._interrupt(self._response, "client_cancelled")
        else:
            self.talker.flush()  # nothing of a response left to clear: no event

    def _finish_response(self, response: _Response, status: EndStatus, error: str | None = None) -> None:
        """The .done events, innermost first, whatever ended the response; the item keeps what was said."""
        if self._response is not response:
            return
        self._response = None
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

    def _part_wire(self, response: _Response) -> proto.TextPart | proto.AudioPart:
        part = response.part
        if response.modality == "audio":
            return proto.AudioPart(transcript=part.transcript or "")
        return proto.TextPart(text=part.text or "")

    def _response_wire(
        self, response: _Response, status: ResponseStatus, error: str | None = None
    ) -> proto.ResponseOut:
        details: proto.CancelledDetails | proto.FailedDetails | None = None
        if status == "cancelled":
            details = proto.CancelledDetails(reason=response.cancel_reason)
        elif status == "failed":
            details = proto.FailedDetails(error=proto.FailureError(type=proto.SERVER_ERROR, message=error))
        return proto.ResponseOut(
            id=response.id,
            status=status,
            status_details=details,
            output=[] if status == "in_progress" else [response.item.to_wire()],
            output_modalities=[response.modality],
            usage=None if status == "in_progress" else usage_wire(response.answer.usage),
        )

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
