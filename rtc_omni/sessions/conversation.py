"""A realtime conversation: a bounded, ordered list of message items with ids.

Items hold what the model is given: text, transcripts, 16 kHz input audio and pinned images.
The list is bounded in count and in the bytes its items hold (text as much as media); past either
bound the oldest items are dropped (the model's context forgets them first, as OpenAI's truncation
does). Each response is computed from `context()`: the trailing user items are its input,
everything before them its history.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from ..protocol.realtime_events import (
    AudioContent,
    ImageContent,
    ItemContent,
    ItemOut,
    ItemStatus,
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


@dataclass
class Item:
    id: str
    role: Role
    parts: list[Part] = field(default_factory=list)
    status: ItemStatus = "completed"

    @property
    def held_bytes(self) -> int:
        return sum(part.held_bytes for part in self.parts)

    def to_wire(self) -> ItemOut:
        return ItemOut(id=self.id, role=self.role, status=self.status, content=[part.to_wire() for part in self.parts])


@dataclass(frozen=True)
class Context:
    """What one response is computed from."""

    history: list[dict[str, Any]]  # earlier items as {"role", "content"} text
    query: str  # the text of the trailing user items
    audio: bytes  # their input audio, 16 kHz PCM16
    images: list[bytes]  # the newest pinned images, oldest first


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
        """The trailing user items as the input, everything before as history, newest images."""
        split = len(self._items)
        while split > 0 and self._items[split - 1].role == "user":
            split -= 1
        earlier, current = self._items[:split], self._items[split:]
        history = [{"role": item.role, "content": " ".join(p.words for p in item.parts if p.words)} for item in earlier]
        parts = [part for item in current for part in item.parts]
        images = [part.image for item in self._items for part in item.parts if part.image is not None]
        return Context(
            history=history,
            query=" ".join(p.text for p in parts if p.type == "input_text" and p.text),
            audio=b"".join(p.audio for p in parts),
            images=images[-MAX_TURN_IMAGES:],
        )
