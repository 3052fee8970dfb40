"""One understanding session's conversation with an upstream `/v1/video/chat/stream` server.

The remote engine keeps one upstream WebSocket per session, so the upstream keeps the conversation
(vLLM-Omni replays the last exchange to the model) and a frame buffer of its own: the session's
frames and microphone audio go to it as they are sampled, and a turn is one `video.query`. The
upstream samples `num_frames` from the same frames the session buffered (its frame filter is off:
ours already filtered them).

vLLM-Omni 0.30 has no message that only cancels a turn (a new `video.query` cancels one and starts
the next). A disconnect makes it abort the engine request at once, so an interrupt closes the socket
and the session goes on with a fresh upstream session, as it does when an upstream fails. A fresh
session gets the frames the old one held; its audio is in step again from its first query, which
carries that turn's audio. The upstream's memory of earlier turns is gone then, and the next turn
says so (`ContextLost`). Upstream addresses go to the log, never into a client-facing message.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import AsyncGenerator, AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import aiohttp

from ..pcm import MAX_AUDIO_BUFFER_BYTES
from ..protocol import understand_messages as understand_proto
from ..protocol.codec import DecodedEvent, MalformedEvent, ServerEvent, UnknownEvent
from .engine import ContextLost, EngineError, LiveSettings
from .upstream import UpstreamPool, UpstreamSocket, b64text

logger = logging.getLogger(__name__)

# The largest message an understanding upstream may send (aiohttp fails the socket past it): a text
# delta, or a WAV audio delta (~40 s of 24 kHz speech). Generation sockets take whole fMP4 chunks.
UNDERSTAND_MESSAGE_BYTES = 4 * 1024 * 1024
KEEPALIVE_S = 20.0  # the upstream ends a session after 60 s without a client message
TURN_EVENT_QUEUE = 256  # upstream events waiting for the turn; a full queue holds the socket back
TEXT_DONE_GRACE_S = 2.0  # audio follows text.done within milliseconds when the upstream speaks at all
MAX_PENDING_AUDIO_BYTES = MAX_AUDIO_BUFFER_BYTES  # the upstream would drop more anyway
# Upstream errors about one frame or chunk: logged, the turn goes on. Every other error ends the turn.
MEDIA_ERRORS = (
    understand_proto.INVALID_IMAGE_DATA,
    understand_proto.FRAME_TOO_LARGE,
    "Frame decode failed",
    understand_proto.AUDIO_BUFFER_OVERFLOW,
)
LOST_BY_FAILURE = "The model server failed; a new one answers, without the earlier turns"
LOST_BY_INTERRUPT = "The interrupt restarted the model's session; it no longer knows the earlier turns"
CLOSED_MID_REQUEST = "the upstream closed the connection mid-request"
MAX_DETAIL_CHARS = 1000  # of an upstream's error, passed on to the client
# Events the turn never looks into, whatever they hold (none come: our frames carry no frame_id).
IGNORED_EVENTS = (understand_proto.Pong.type, understand_proto.FrameAck.type, understand_proto.FramesConsumed.type)
_CLOSED = None  # the reader's last word to a waiting turn


def too_big_message(max_bytes: int) -> str:
    """Why a request failed when its upstream sent more than the socket's size cap."""
    return f"the upstream sent a message over {max_bytes} bytes"


def upstream_error(event: understand_proto.ErrorEvent) -> str:
    """What an upstream's `error` event says: its message, and its detail when it gives one (rtc-omni's
    does: why a turn failed, e.g. that the model's engine is down), cut to MAX_DETAIL_CHARS."""
    said = f"{event.message}: {event.detail}" if event.detail else event.message
    return f"upstream: {said[:MAX_DETAIL_CHARS]}"


def unreadable(event: MalformedEvent) -> str:
    """Why a request failed on an upstream message it could not read, cut to MAX_DETAIL_CHARS."""
    what = (
        f"a message that is {event.problem}"
        if event.type is None
        else f"a malformed {event.type} event: {event.problem}"
    )
    return f"the upstream sent {what}"[:MAX_DETAIL_CHARS]


@dataclass
class _Connection(UpstreamSocket):
    failure: str = CLOSED_MID_REQUEST  # what a turn in progress is told when the reader stops
    answered: bool = False  # it completed a turn, so it holds conversation the next one may lack


@dataclass
class UpstreamTurn:
    """What one `video.query` brings."""

    query: str
    audio_pcm16: bytes
    frames: list[bytes] = field(default_factory=list)  # encoded; the newest last


class UpstreamSession:
    """The remote engine's `EngineSession`: one live upstream WebSocket, reopened after a failure."""

    def __init__(self, pool: UpstreamPool, session_id: str, settings: LiveSettings) -> None:
        self.pool = pool
        self.session_id = session_id
        self.settings = settings
        self._held: deque[bytes] = deque(maxlen=settings.max_frames)  # what the upstream's buffer holds
        self._pending_frames: deque[bytes] = deque(maxlen=settings.max_frames)
        self._pending_audio = bytearray()
        self._pending_query: dict[str, Any] | None = None
        self._audio_in_step = False  # the upstream's audio buffer matches ours (from a connection's first query)
        self._connection: _Connection | None = None
        self._connect_lock = asyncio.Lock()
        self._wake = asyncio.Event()
        self._writer_paused = False  # after a failed connect, until the next turn reconnects
        self._turn_events: asyncio.Queue[DecodedEvent | None] | None = None
        self._context_lost: str | None = None  # why, when the next turn must say so
        self._writer = asyncio.get_running_loop().create_task(self._write())

    # ----------------------------------------------------------------- media, as the session samples it

    def add_frame(self, image: bytes) -> None:
        self._held.append(image)
        self._pending_frames.append(image)
        self._wake.set()

    def add_audio(self, pcm16: bytes) -> None:
        if not self._audio_in_step:
            return  # the next query carries its turn's audio
        if len(self._pending_audio) + len(pcm16) > MAX_PENDING_AUDIO_BYTES:
            self._pending_audio.clear()
        self._pending_audio.extend(pcm16)
        self._wake.set()

    # ----------------------------------------------------------------- the connection

    def _config_message(self) -> dict[str, Any]:
        s = self.settings
        config: dict[str, Any] = {
            "type": "session.config",
            "modalities": list(s.modalities),
            "num_frames": s.num_frames,
            "max_frames": s.max_frames,
            "enable_frame_filter": False,  # the session already filtered
            "use_audio_in_video": s.use_audio_in_video,
        }
        for name in ("model", "system_prompt", "sampling_params_list"):
            if getattr(s, name) is not None:
                config[name] = getattr(s, name)
        return config

    async def _connected(self) -> _Connection:
        """The live connection, or a fresh upstream session primed with the frames we hold."""
        async with self._connect_lock:
            connection = self._connection
            if connection is not None and not connection.ws.closed and not connection.closing:
                return connection
            await self._drop()
            upstream, ws = await self.pool.open()
            connection = _Connection(upstream, ws)
            try:
                await ws.send_json(self._config_message())
                for image in list(self._held):
                    await ws.send_json({"type": "video.frame", "data": b64text(image)})
            except (aiohttp.ClientError, ConnectionError) as exc:
                logger.warning("session %s: upstream %s failed at setup: %s", self.session_id, upstream.url, exc)
                self.pool.mark_down(upstream)
                await self.pool.release(upstream, ws)
                raise EngineError(CLOSED_MID_REQUEST) from exc
            self._pending_frames.clear()
            self._pending_audio.clear()
            self._audio_in_step = False
            connection.reader = asyncio.get_running_loop().create_task(self._read(connection))
            self._connection = connection
            logger.info("session %s: upstream session on %s", self.session_id, upstream.url)
            return connection

    async def _drop(self, interrupted: bool = False) -> None:
        """Close the current connection (the upstream aborts any request it runs for it)."""
        connection, self._connection = self._connection, None
        if connection is None:
            return
        if connection.answered and self._context_lost is None:
            self._context_lost = LOST_BY_INTERRUPT if interrupted else LOST_BY_FAILURE
        connection.closing = True
        if interrupted:
            logger.info("session %s: interrupt: closing upstream %s", self.session_id, connection.upstream.url)
        await self.pool.release(connection.upstream, connection.ws)
        if connection.reader is not None and connection.reader is not asyncio.current_task():
            connection.reader.cancel()
            await asyncio.gather(connection.reader, return_exceptions=True)

    async def _read(self, connection: _Connection) -> None:
        ws = connection.ws
        while True:
            message = await ws.receive()
            if message.type == aiohttp.WSMsgType.TEXT:
                await self._route(connection, understand_proto.decode_server_event(message.data))
            elif message.type != aiohttp.WSMsgType.BINARY:
                if getattr(message.data, "code", None) == aiohttp.WSCloseCode.MESSAGE_TOO_BIG:
                    connection.failure = too_big_message(self.pool.max_message_bytes)
                break
        if not connection.closing:
            logger.warning("session %s: upstream %s closed the connection", self.session_id, connection.upstream.url)
            self.pool.mark_down(connection.upstream)
            if connection.answered:
                self._context_lost = LOST_BY_FAILURE
        if self._turn_events is not None and self._connection is connection:
            await self._turn_events.put(_CLOSED)

    async def _route(self, connection: _Connection, event: DecodedEvent) -> None:
        error = event if isinstance(event, understand_proto.ErrorEvent) else None
        if error is not None and error.message == understand_proto.NOT_AVAILABLE:
            self.pool.mark_not_serving(connection.upstream)  # one model per vLLM-Omni server
        if error is not None and error.message in MEDIA_ERRORS:
            logger.info("session %s: upstream %s: %s", self.session_id, connection.upstream.url, error.message)
        elif (isinstance(event, MalformedEvent) and event.type is None) or event.type in IGNORED_EVENTS:
            pass  # what is no JSON object at all, and the acks
        elif self._turn_events is not None:
            await self._turn_events.put(event)
        else:
            logger.debug("session %s: upstream event outside a turn: %s", self.session_id, event.type)

    async def _write(self) -> None:
        """Send what the session sampled, then a waiting query, in that order; keep the session alive."""
        while True:
            try:
                async with asyncio.timeout(KEEPALIVE_S):
                    await self._wake.wait()
            except TimeoutError:
                if self._connection is not None and not self._connection.ws.closed:
                    await self._send_all(self._connection, [{"type": "ping"}])
                continue
            self._wake.clear()
            if self._writer_paused and self._pending_query is None:
                continue
            try:
                connection = await self._connected()
            except EngineError:
                self._writer_paused = True
                if self._turn_events is not None:
                    await self._turn_events.put(_CLOSED)
                continue
            messages = [{"type": "video.frame", "data": b64text(image)} for image in self._pending_frames]
            self._pending_frames.clear()
            if self._pending_audio and self._audio_in_step:
                messages.append({"type": "audio.chunk", "data": b64text(bytes(self._pending_audio))})
            self._pending_audio.clear()
            if self._pending_query is not None:
                messages.append(self._pending_query)
                self._pending_query = None
                self._audio_in_step = self.settings.audio_streamed
            await self._send_all(connection, messages)

    async def _send_all(self, connection: _Connection, messages: list[dict[str, Any]]) -> None:
        try:
            for message in messages:
                await connection.ws.send_json(message)
        except (aiohttp.ClientError, ConnectionError) as exc:
            logger.warning("session %s: upstream %s send failed: %s", self.session_id, connection.upstream.url, exc)
            await connection.ws.close()  # the reader sees it and tells a waiting turn

    # ----------------------------------------------------------------- turns

    async def turn(self, turn: UpstreamTurn) -> AsyncGenerator[ServerEvent | UnknownEvent | ContextLost, None]:
        """Ask one question; yields the upstream's events of that turn (and `ContextLost` first
        when the upstream session was replaced since the last answer)."""
        self._writer_paused = False
        connection = await self._connected()
        if self._context_lost is not None:
            yield ContextLost(self._context_lost)
            self._context_lost = None
        for image in turn.frames:
            if not any(held is image for held in self._held):
                self.add_frame(image)  # e.g. the newest camera frame, which EVS kept out of the buffer
        query: dict[str, Any] = {"type": "video.query", "text": turn.query}
        if turn.audio_pcm16 and not self._audio_in_step:
            query["audio_data"] = b64text(turn.audio_pcm16)
        events: asyncio.Queue[DecodedEvent | None] = asyncio.Queue(TURN_EVENT_QUEUE)
        if connection.reader is not None and connection.reader.done():  # it went away before this turn
            events.put_nowait(_CLOSED)
        self._turn_events = events
        self._pending_query = query
        self._wake.set()
        finished = False
        try:
            async for event in self._turn_events_until_done(events):
                yield event
            finished = True
            connection.answered = True
        except EngineError:
            finished = self._connection is connection  # an upstream error; the connection is fine
            raise
        finally:
            self._turn_events = None
            if not finished:
                await self._drop(interrupted=True)

    async def _turn_events_until_done(
        self, events: asyncio.Queue[DecodedEvent | None]
    ) -> AsyncIterator[ServerEvent | UnknownEvent]:
        """The turn's events up to its end, which vLLM-Omni marks with audio.done, or text.done when
        no audio is coming. An error, or an event it cannot read, ends the turn with an EngineError."""
        speaks = "audio" in self.settings.modalities
        started = text_done = audio_seen = False
        while True:
            grace = TEXT_DONE_GRACE_S if text_done and not audio_seen else None
            try:
                async with asyncio.timeout(grace):
                    event = await events.get()
            except TimeoutError:
                return
            if event is _CLOSED:
                connection = self._connection
                raise EngineError(connection.failure if connection is not None else CLOSED_MID_REQUEST)
            if isinstance(event, understand_proto.ErrorEvent):
                raise EngineError(upstream_error(event))
            if isinstance(event, MalformedEvent):
                raise EngineError(unreadable(event))
            if isinstance(event, understand_proto.ResponseStart):
                started = True
            if not started:
                continue  # the tail of an earlier turn that ended without audio.done
            yield event
            if isinstance(event, understand_proto.TextDone):
                text_done = True
                if not speaks:
                    return
            elif isinstance(event, understand_proto.AudioDeltaEvent):
                audio_seen = True
            elif isinstance(event, understand_proto.AudioDone):
                return

    async def close(self) -> None:
        self._writer.cancel()
        await asyncio.gather(self._writer, return_exceptions=True)
        async with self._connect_lock:
            await self._drop()
