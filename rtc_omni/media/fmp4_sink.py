"""Generated video for a WebSocket client: the session's frames as fMP4 chunks (vLLM-Omni's wire form).

The `VideoSink` a generation session writes to when its transport is the WebSocket endpoint. The
session announces each engine chunk with a `video.chunk_metadata` event and then puts its frames;
this sink holds the event, encodes the frames, and sends the event (with `byte_length` and
`transport_chunk_index`) followed by one binary message of fMP4 bytes. The end of the stream
sends the encoder's trailer the same way (`kind: "trailer"`), except after a stop, as upstream.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import numpy as np

from .fmp4 import FragmentedMp4Encoder

FrameObserver = Callable[[np.ndarray], Awaitable[None]]


class Fmp4ChunkSink:
    """Frames in, `video.chunk_metadata` + binary fMP4 message pairs out, not paced (as upstream)."""

    def __init__(self, send_json: Callable[[dict[str, Any]], None], send_bytes: Callable[[bytes], Awaitable[None]]):
        self.fps = 24.0
        self.frames_sent = 0
        self.messages_sent = 0
        self.on_frame_sent: FrameObserver | None = None
        self._send_json = send_json
        self._send_bytes = send_bytes
        self._encoder: FragmentedMp4Encoder | None = None
        self._metadata: dict[str, Any] | None = None  # the chunk whose frames are arriving
        self._frames_left = 0
        self._pending = bytearray()
        self._stopped = False
        self._trailer: asyncio.Task[None] | None = None

    def send_event(self, event: dict[str, Any]) -> None:
        """The session's `send`: chunk metadata waits for its bytes; `session.done` counts messages."""
        if event["type"] == "video.chunk_metadata":
            self._metadata = event
            self._frames_left = event["num_frames"]
            return
        if event["type"] == "session.done":
            event = {**event, "chunks": self.messages_sent}  # upstream counts binary messages
        self._send_json(event)

    async def put(self, rgb: np.ndarray) -> None:
        if self._stopped:
            return
        if self._encoder is None:
            self._encoder = FragmentedMp4Encoder(self.fps)
        self._pending += await asyncio.to_thread(self._encoder.encode, rgb)
        self.frames_sent += 1
        if self.on_frame_sent is not None:
            await self.on_frame_sent(rgb)
        self._frames_left -= 1
        if self._frames_left <= 0 and self._metadata is not None:
            await self._send_chunk(self._metadata, "media")

    async def _send_chunk(self, metadata: dict[str, Any], kind: str) -> None:
        data, self._pending = bytes(self._pending), bytearray()
        if not data or self._stopped:
            return
        self._send_json(
            {**metadata, "kind": kind, "byte_length": len(data), "transport_chunk_index": self.messages_sent}
        )
        await self._send_bytes(data)
        self.messages_sent += 1

    async def _send_trailer(self) -> None:
        assert self._encoder is not None
        self._pending += await asyncio.to_thread(self._encoder.close)
        last = self._metadata or {}
        trailer = {
            "type": "video.chunk_metadata",
            "request_id": last.get("request_id"),
            "num_frames": 0,
            "generation_chunk_index": last.get("generation_chunk_index", 0),
            "started_event_ids": [],
            "active_event_ids": [],
            "completed_event_ids": [],
        }
        await self._send_chunk(trailer, "trailer")

    def flush(self) -> int:
        """A stop: nothing more is sent, not even the trailer (the reference's stopped stream)."""
        self._stopped = True
        self._pending.clear()
        return 0

    def end_of_stream(self) -> None:
        if not self._stopped and self._encoder is not None and self._trailer is None:
            self._trailer = asyncio.get_running_loop().create_task(self._send_trailer())

    async def wait_drained(self, timeout: float) -> bool:
        """Wait for the trailer to be queued (frames are sent as they are put)."""
        if self._trailer is None:
            return True
        done, _ = await asyncio.wait([self._trailer], timeout=timeout)
        return bool(done)

    def close(self) -> None:
        """Drop whatever is unsent (the encoder of a stopped stream is never finished)."""
        self.flush()
        if self._trailer is not None:
            self._trailer.cancel()
        self._encoder = None
