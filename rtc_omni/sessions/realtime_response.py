"""One realtime response's output items and their events, in OpenAI's order.

A response's output is made as the model makes it: a message item when it first says something, a
function_call item for each call. Each item is opened with `response.output_item.added` (and
`conversation.item.added` when the response writes to the conversation), streams its deltas, and
is closed with its `.done` events from the innermost out before the next item opens; whatever is
still open when the response ends is closed then. A response that only calls a tool has no message
item, so no text, no audio and no `output_audio_buffer.started`. An out-of-band response
(`conversation: "none"`) writes nothing to the conversation and never speaks on the call's track.
"""

from __future__ import annotations

import base64
from collections.abc import Callable
from typing import Literal

from ..protocol import realtime_events as proto
from .answer import Answer
from .conversation import Conversation, Item, Part

ResponseStatus = Literal["in_progress", "completed", "cancelled", "failed"]
EndStatus = Literal["completed", "cancelled", "failed"]
CancelReason = Literal["client_cancelled", "turn_detected"]
Modality = Literal["text", "audio"]
Emit = Callable[[proto.RealtimeEvent], None]


class RealtimeResponse:
    def __init__(
        self,
        answer: Answer,
        *,
        modality: Modality,
        emit: Emit,
        conversation: Conversation | None,
        conversation_id: str | None,
        metadata: dict[str, str] | None = None,
    ) -> None:
        self.answer = answer
        self.modality = modality
        self.conversation = conversation  # None: out-of-band
        self.conversation_id = conversation_id
        self.metadata = metadata
        self.cancel_reason: CancelReason = "client_cancelled"
        self.outputs: list[Item] = []
        self.message: Item | None = None  # the message item the model spoke or wrote into, once it did
        self.message_id = proto.new_id("item")  # known before it opens: an engine mirroring items names it
        self.ended = False
        self._emit = emit
        self._open: Item | None = None

    @property
    def id(self) -> str:
        return self.answer.request_id

    @property
    def out_of_band(self) -> bool:
        return self.conversation is None

    @property
    def calls(self) -> list[Item]:
        return [item for item in self.outputs if item.type == "function_call"]

    # ----------------------------------------------------------------- the model's output

    def text(self, delta: str) -> None:
        item = self._message()
        part = item.parts[0]
        ids = {"response_id": self.id, "item_id": item.id, "output_index": self.outputs.index(item)}
        if self.modality == "audio":
            part.transcript = (part.transcript or "") + delta
            self._emit(proto.TranscriptDelta(**ids, delta=delta))
        else:
            part.text = (part.text or "") + delta
            self._emit(proto.TextDelta(**ids, delta=delta))

    def audio(self, pcm16: bytes, first: bool) -> None:
        """Speech: on the call's track (the talker has it), or as output_audio.delta events."""
        if self.modality != "audio":
            return
        item = self._message()
        if self.answer.talker is None:
            delta = base64.b64encode(pcm16).decode("ascii")
            index = self.outputs.index(item)
            self._emit(proto.AudioDelta(response_id=self.id, item_id=item.id, output_index=index, delta=delta))
        elif first:
            self._emit(proto.OutputAudioStarted(response_id=self.id))
        item.parts[0].audio += pcm16  # what was sent: truncation cuts it to what was heard

    def call_started(self, call_id: str, name: str) -> None:
        self._close_open("completed")
        item = Item(id=proto.new_id("item"), type="function_call", call_id=call_id, name=name, status="in_progress")
        self._open_item(item)

    def arguments(self, call_id: str, delta: str) -> None:
        item = self._open
        if item is None or item.type != "function_call" or item.call_id != call_id:
            return  # arguments of no open call: the engine broke its contract; nothing to attach them to
        item.arguments += delta
        self._emit(
            proto.ArgumentsDelta(
                response_id=self.id,
                item_id=item.id,
                output_index=self.outputs.index(item),
                call_id=call_id,
                delta=delta,
            )
        )

    def generated(self) -> None:
        """The model is done: its items are complete now (a call's output can be worked on), while
        `response.done` waits for the speech to play out."""
        self._close_open("completed")

    # ----------------------------------------------------------------- the end

    def finish(self, status: EndStatus, error: str | None = None) -> None:
        """Close what is open and send `response.done`; once."""
        if self.ended:
            return
        self.ended = True
        self._close_open("completed" if status == "completed" else "incomplete")
        self._emit(proto.ResponseDone(response=self.wire(status, error)))

    def wire(self, status: ResponseStatus, error: str | None = None) -> proto.ResponseOut:
        details: proto.CancelledDetails | proto.FailedDetails | None = None
        if status == "cancelled":
            details = proto.CancelledDetails(reason=self.cancel_reason)
        elif status == "failed":
            details = proto.FailedDetails(error=proto.FailureError(type=proto.SERVER_ERROR, message=error))
        return proto.ResponseOut(
            id=self.id,
            status=status,
            status_details=details,
            output=[] if status == "in_progress" else [item.to_wire() for item in self.outputs],
            output_modalities=[self.modality],
            conversation_id=self.conversation_id,
            metadata=self.metadata,
            usage=None if status == "in_progress" else usage_wire(self.answer),
        )

    # ----------------------------------------------------------------- items

    def _message(self) -> Item:
        """The message item being written, opened (with its one content part) at the first output."""
        if self._open is not None and self._open.type == "message":
            return self._open
        self._close_open("completed")
        item = Item(id=self.message_id, role="assistant", status="in_progress")
        self._open_item(item)
        part = (
            Part(type="output_audio", transcript="") if self.modality == "audio" else Part(type="output_text", text="")
        )
        item.parts.append(part)
        index = self.outputs.index(item)
        self._emit(
            proto.ContentPartAdded(response_id=self.id, item_id=item.id, output_index=index, part=part_wire(part))
        )
        self.message = item
        return item

    def _open_item(self, item: Item) -> None:
        self.outputs.append(item)
        self._open = item
        index = len(self.outputs) - 1
        self._emit(proto.OutputItemAdded(response_id=self.id, output_index=index, item=item.to_wire()))
        if self.conversation is not None:
            previous = self.conversation.insert(item)
            self._emit(proto.ItemAdded(item=item.to_wire(), previous_item_id=previous))

    def _close_open(self, status: Literal["completed", "incomplete"]) -> None:
        item, self._open = self._open, None
        if item is None:
            return
        index = self.outputs.index(item)
        ids = {"response_id": self.id, "item_id": item.id, "output_index": index}
        if item.type == "function_call":
            self._emit(proto.ArgumentsDone(**ids, call_id=item.call_id, name=item.name, arguments=item.arguments))
        else:
            part = item.parts[0]
            if part.type == "output_audio":
                self._emit(proto.AudioDone(**ids))
                self._emit(proto.TranscriptDone(**ids, transcript=part.transcript or ""))
            else:
                self._emit(proto.TextDone(**ids, text=part.text or ""))
            self._emit(proto.ContentPartDone(**ids, part=part_wire(part)))
        item.status = status
        wire = item.to_wire()
        self._emit(proto.OutputItemDone(response_id=self.id, output_index=index, item=wire))
        if self.conversation is not None and self.conversation.get(item.id) is not None:
            self._emit(proto.ItemDone(item=wire, previous_item_id=self.conversation.previous_id(item)))


def part_wire(part: Part) -> proto.TextPart | proto.AudioPart:
    if part.type == "output_audio":
        return proto.AudioPart(transcript=part.transcript or "")
    return proto.TextPart(text=part.text or "")


def usage_wire(answer: Answer) -> proto.ResponseUsage | None:
    """The engine's count in the shape of OpenAI's RealtimeResponseUsage (what it does not count, null)."""
    usage = answer.usage
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
