"""A realtime conversation: a bounded, ordered list of message items with ids.

Items hold what the model is given: text, transcripts, 16 kHz input audio, pinned images, and
function calls with their outputs.
The list is bounded in count and in the bytes its items hold (text as much as media); past either
bound the oldest items are dropped (the model's context forgets them first, as OpenAI's truncation
does). Each response is computed from `context()`: the trailing user items are its input,
everything before them its history. An out-of-band response with its own `input` is computed the
same way from those items (`context_of`).
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, Literal

from ..protocol.realtime_events import (
    AudioContent,
    FunctionCallOut,
    FunctionCallOutputOut,
    ImageContent,
    ItemContent,
    ItemOut,
    ItemStatus,
    MessageOut,
    PartType,
    Role,
    TextContent,
)

MAX_ITEMS = 128
MAX_CONVERSATION_BYTES = 64 * 1024 * 1024  # audio, images and text held by all items together
MAX_TURN_IMAGES = 4  # the newest pinned images go with each response
ROOT = "root"  # a previous_item_id that inserts at the start


@dataclass
class Part:
    """One content part. `audio` is PCM16: an input_audio part's at 16 kHz (what the engine takes),
    an output_audio part's at 24 kHz (what was sent, cut by truncation); `image` the encoded file."""

    type: PartType
    text: str | None = None
    transcript: str | None = None
    audio: bytes = b""
    image: bytes | None = None

    @property
    def held_bytes(self) -> int:
        """What the part holds in memory; a string's size is known at once, whatever its length."""
        text = sum(sys.getsizeof(words) for words in (self.text, self.transcript) if words)
        return len(self.audio) + len(self.image or b"") + text

    @property
    def words(self) -> str:
        """What the model reads of this part as history."""
        return self.text if self.text is not None else self.transcript or ""

    def to_wire(self) -> ItemContent:
        """OpenAI's shape, without audio or image data (retrieve them from the client's own copy)."""
        if self.type == "input_text" or self.type == "output_text":
            return TextContent(type=self.type, text=self.text)
        if self.type == "input_audio" or self.type == "output_audio":
            return AudioContent(type=self.type, transcript=self.transcript)
        return ImageContent()


ItemType = Literal["message", "function_call", "function_call_output"]


@dataclass
class Item:
    """A message (`role`, `parts`), a function call (`call_id`, `name`, `arguments`) or a call's
    output (`call_id`, `output`). A function_call is the assistant's and its output the tool's:
    neither is user input."""

    id: str
    role: Role = "assistant"
    parts: list[Part] = field(default_factory=list)
    status: ItemStatus = "completed"
    type: ItemType = "message"
    call_id: str = ""
    name: str = ""
    arguments: str = ""
    output: str = ""

    @property
    def held_bytes(self) -> int:
        text = sum(sys.getsizeof(words) for words in (self.arguments, self.output) if words)
        return sum(part.held_bytes for part in self.parts) + text

    @property
    def is_user_input(self) -> bool:
        return self.type == "message" and self.role == "user"

    def to_wire(self) -> ItemOut:
        if self.type == "function_call":
            return FunctionCallOut(
                id=self.id, status=self.status, call_id=self.call_id, name=self.name, arguments=self.arguments
            )
        if self.type == "function_call_output":
            return FunctionCallOutputOut(id=self.id, status=self.status, call_id=self.call_id, output=self.output)
        return MessageOut(
            id=self.id, role=self.role, status=self.status, content=[part.to_wire() for part in self.parts]
        )


@dataclass(frozen=True)
class Context:
    """What one response is computed from."""

    history: list[dict[str, Any]]  # earlier items as {"role", "content"} text
    query: str  # the text of the trailing user items
    audio: bytes  # their input audio, 16 kHz PCM16
    images: list[bytes]  # the newest pinned images, oldest first
    history_ids: tuple[str, ...] = ()  # the id of the item each history message starts with
    input_ids: tuple[str, ...] = ()  # the trailing user items'


class Conversation:
    def __init__(self, max_items: int = MAX_ITEMS, max_bytes: int = MAX_CONVERSATION_BYTES) -> None:
        self.max_items = max_items
        self.max_bytes = max_bytes
        self._items: list[Item] = []

    def __len__(self) -> int:
        return len(self._items)

    def __iter__(self) -> Iterator[Item]:
        return iter(self._items)

    def get(self, item_id: str) -> Item | None:
        return next((item for item in self._items if item.id == item_id), None)

    def call(self, call_id: str, item_type: ItemType = "function_call") -> Item | None:
        """The conversation's function_call (or function_call_output) item with `call_id`."""
        return next((item for item in self._items if item.type == item_type and item.call_id == call_id), None)

    def insert(self, item: Item, previous_item_id: str | None = None) -> str | None:
        """Add `item` after `previous_item_id` (None: at the end, ROOT: at the start); returns the id
        it follows. KeyError when `previous_item_id` is not in the conversation."""
        if previous_item_id is None:
            at = len(self._items)
        elif previous_item_id == ROOT:
            at = 0
        else:
            previous = self.get(previous_item_id)
            if previous is None:
                raise KeyError(previous_item_id)
            at = self._items.index(previous) + 1
        self._items.insert(at, item)
        self._bound(keep=item)
        return self.previous_id(item)

    def previous_id(self, item: Item) -> str | None:
        """The id of the item before `item` (None at the start)."""
        position = self._items.index(item)
        return self._items[position - 1].id if position > 0 else None

    def delete(self, item_id: str) -> bool:
        item = self.get(item_id)
        if item is None:
            return False
        self._items.remove(item)
        return True

    def clear(self) -> None:
        self._items.clear()

    @property
    def held_bytes(self) -> int:
        return sum(item.held_bytes for item in self._items)

    def _bound(self, keep: Item) -> None:
        """Drop the oldest items (never `keep`) past the count or byte bound."""
        while len(self._items) > 1 and (len(self._items) > self.max_items or self.held_bytes > self.max_bytes):
            self._items.remove(next(i for i in self._items if i is not keep))

    def context(self) -> Context:
        return context_of(self._items)


def context_of(items: list[Item]) -> Context:
    """The user's messages since the model last spoke or called as the input, everything else as
    history in order, the newest images.

    A call's output does not end the user's turn: what the user said while the tool ran is their
    input, and the output is history before it."""
    split = len(items)
    while split > 0 and (items[split - 1].is_user_input or items[split - 1].type == "function_call_output"):
        split -= 1
    current = [item for item in items[split:] if item.is_user_input]
    earlier = items[:split] + [item for item in items[split:] if not item.is_user_input]
    parts = [part for item in current for part in item.parts]
    images = [part.image for item in items for part in item.parts if part.image is not None]
    messages = chat_history(earlier)
    return Context(
        history=[message for _, message in messages],
        query=" ".join(p.text for p in parts if p.type == "input_text" and p.text),
        audio=b"".join(p.audio for p in parts),
        images=images[-MAX_TURN_IMAGES:],
        history_ids=tuple(item_id for item_id, _ in messages),
        input_ids=tuple(item.id for item in current),
    )


def chat_history(items: list[Item]) -> list[tuple[str, dict[str, Any]]]:
    """Items as chat-completions messages, each with the id of the item it starts with: a call joins
    the assistant message before it (one turn that spoke and then called), a call's output is a
    `tool` message."""
    history: list[tuple[str, dict[str, Any]]] = []
    for item in items:
        if item.type == "function_call":
            call = {
                "id": item.call_id,
                "type": "function",
                "function": {"name": item.name, "arguments": item.arguments},
            }
            last = history[-1][1] if history else None
            if last is None or last["role"] != "assistant":
                last = {"role": "assistant", "content": ""}
                history.append((item.id, last))
            last.setdefault("tool_calls", []).append(call)
        elif item.type == "function_call_output":
            history.append((item.id, {"role": "tool", "tool_call_id": item.call_id, "content": item.output}))
        else:
            words = " ".join(p.words for p in item.parts if p.words)
            history.append((item.id, {"role": item.role, "content": words}))
    return history
