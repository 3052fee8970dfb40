"""The WebSocket transport: vLLM-Omni's own endpoints, served by the same session classes as WebRTC.

`/v1/video/chat/stream` binds an `UnderstandSession` and `/v1/realtime/video` a `GenerateSession`
to one WebSocket each, with `strict_reference` set so that they behave as the reference handlers
do (docs/websocket.md lists every difference from the DataChannel). `/v1/realtime` binds a
`RealtimeSession`: the OpenAI Realtime API (docs/realtime.md). Text messages go to
`receive_text`, events come back as JSON text through an outbox bounded in bytes (a client that
stops reading is disconnected), generated video as fMP4 binary messages (media/fmp4_sink.py). A
WebSocket client is a peer without media tracks: speech comes back as `response.audio.delta` WAV
events, as upstream (`response.output_audio.delta` with `--websocket-audio-events
response.output_audio`, as vLLM-Omni 0.30 names them).
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections import deque
from collections.abc import Callable
from typing import Any

from aiohttp import WSCloseCode, WSMsgType, web

from ..logs import SESSION_ID
from ..media.fmp4_sink import Fmp4ChunkSink
from ..protocol import generate_messages as generate_proto
from ..protocol import realtime_events as realtime_proto
from ..protocol import understand_messages as understand_proto
from ..sessions.registry import SessionLimitReached
from ..tasks import TaskSet
from .client_secrets import opening_config, spend_key
from .factory import AnySession, KindNotServed, Services, create_session
from .keys import REGISTRY, SETTINGS
from .limits import opens_session

logger = logging.getLogger(__name__)

MAX_OUTBOX_BYTES = 64 * 1024 * 1024  # unsent events: what one largest client message brings back, twice over
SEND_TIMEOUT_S = 30.0
DRAIN_TIMEOUT_S = 2.0  # for the last events of a closing session
CLOSE_TIMEOUT_S = 10.0  # for the closing handshake (aiohttp's own default); then the connection is dropped
NOT_READING = "client not reading: its unsent events passed the server's bound"
MESSAGE_SLACK_BYTES = 64 * 1024  # above the protocol's limits, so the session reports the overrun
START_MESSAGE_LIMIT = 4 * 1024 * 1024
REALTIME_MESSAGE_LIMIT = 16 * 1024 * 1024  # an input_audio_buffer.append of OpenAI's 15 MiB, or an image item


class Outbox:
    """What goes to one WebSocket, in order, through one writer task, bounded in bytes not yet sent.

    JSON events never wait: a client so slow that MAX_OUTBOX_BYTES of them pile up is disconnected.
    Binary video waits (bounded) while the outbox is over half full, which back-pressures the
    generation and leaves the other half to the events.
    """

    def __init__(self, ws: web.WebSocketResponse, max_bytes: int = MAX_OUTBOX_BYTES) -> None:
        self._ws = ws
        self.max_bytes = max_bytes
        self.unsent_bytes = 0  # queued, or being written
        self._items: deque[str | bytes] = deque()
        self._arrived = asyncio.Event()
        self._sent = asyncio.Event()
        self.overflowed = asyncio.Event()

    def send_json(self, event: dict[str, Any]) -> None:
        self._put(json.dumps(event, separators=(",", ":")))  # ASCII: its length is its size

    async def send_bytes(self, data: bytes) -> None:
        async with asyncio.timeout(SEND_TIMEOUT_S):
            while self.unsent_bytes > self.max_bytes // 2:
                await self._wait_sent()
        self._put(data)

    def _put(self, item: str | bytes) -> None:
        if self.overflowed.is_set():
            return
        if self.unsent_bytes + len(item) > self.max_bytes:
            logger.warning("websocket client is not reading (%d bytes unsent); disconnecting it", self.unsent_bytes)
            self.overflowed.set()
            return
        self._items.append(item)
        self.unsent_bytes += len(item)
        self._arrived.set()

    async def _wait_sent(self) -> None:
        self._sent.clear()
        await self._sent.wait()

    async def run(self) -> None:
        while True:
            while not self._items:
                self._arrived.clear()
                await self._arrived.wait()
            item = self._items[0]
            try:
                if isinstance(item, str):
                    await self._ws.send_str(item)
                else:
                    await self._ws.send_bytes(item)
            except ConnectionError:  # the client is gone: nothing more will leave
                self._items.clear()
                self.unsent_bytes = 0
                self._sent.set()
                return
            self._items.popleft()
            self.unsent_bytes -= len(item)
            self._sent.set()

    async def drain(self, timeout: float) -> None:
        try:
            async with asyncio.timeout(timeout):
                while self._items:
                    await self._wait_sent()
        except TimeoutError:
            logger.info("websocket outbox not drained after %.1f s", timeout)


class WebSocketCarrier:
    """A WebSocket client's carrier: events as JSON text, no talker (speech comes as audio events),
    generated video as fMP4 binary messages, each announced by its event (media/fmp4_sink.py)."""

    def __init__(self, outbox: Outbox, audio_events: str) -> None:
        self._outbox = outbox
        self._send_json = _with_audio_names(outbox.send_json, audio_events)
        self.sink: Fmp4ChunkSink | None = None

    def send(self, event: dict[str, Any]) -> None:
        if self.sink is not None:
            self.sink.send_event(event)  # in order with the video's binary messages
        else:
            self._send_json(event)

    def talker(self) -> None:
        return None

    def video(self) -> Fmp4ChunkSink:
        self.sink = Fmp4ChunkSink(self._send_json, self._outbox.send_bytes)
        return self.sink


class WebSocketSession:
    """One session and the WebSocket that carries it; registered like a peer session."""

    def __init__(
        self,
        session_id: str,
        ws: web.WebSocketResponse,
        outbox: Outbox,
        session: AnySession,
        sink: Fmp4ChunkSink | None = None,
        transport: asyncio.Transport | None = None,
    ) -> None:
        self.session_id = session_id
        self.kind = session.kind
        self.ws = ws
        self.outbox = outbox
        self.session = session
        self._sink = sink
        self._transport = transport
        self._tasks = TaskSet()
        self.closed = asyncio.Event()

    async def serve(self) -> None:
        """Run until the client leaves, the session ends, or the client stops reading."""
        self._tasks.spawn(self.outbox.run())
        self.session.start()
        reader = self._tasks.spawn(self._read())
        ended = asyncio.ensure_future(self.session.closed.wait())
        overflow = asyncio.ensure_future(self.outbox.overflowed.wait())
        try:
            await asyncio.wait([reader, ended, overflow], return_when=asyncio.FIRST_COMPLETED)
        finally:
            ended.cancel()
            overflow.cancel()
            await self.close()

    async def _read(self) -> None:
        async for message in self.ws:
            if message.type == WSMsgType.TEXT:
                self.session.receive_text(message.data)
            elif message.type == WSMsgType.BINARY:
                self.session.receive_binary(message.data)

    async def close(self) -> None:
        """Close the session, let its last events leave, then close the socket; idempotent."""
        if self.closed.is_set():
            return
        self.closed.set()
        await self.session.close()
        if not self.outbox.overflowed.is_set():
            await self.outbox.drain(DRAIN_TIMEOUT_S)
        if self._sink is not None:
            self._sink.close()
        await self._tasks.cancel_all()
        await self._close_socket()

    async def _close_socket(self) -> None:
        """Close the socket, bounded in time: a client that stopped reading is told why (1008) if it
        takes the close frame within CLOSE_TIMEOUT_S; then the connection and what it holds are dropped."""
        code, reason = WSCloseCode.OK, ""
        if self.outbox.overflowed.is_set():
            code, reason = WSCloseCode.POLICY_VIOLATION, NOT_READING
        try:
            async with asyncio.timeout(CLOSE_TIMEOUT_S):
                await self.ws.close(code=code, message=reason.encode())
        except TimeoutError:
            if self._transport is not None:
                self._transport.abort()

    async def stats(self) -> dict[str, Any]:
        return {"session_id": self.session_id, **self.session.stats(), "transport": "websocket"}


async def _refuse(ws: web.WebSocketResponse, message: str) -> web.WebSocketResponse:
    """The reference's answer when it cannot serve: accept, send one `error`, close."""
    await ws.send_json({"type": "error", "message": message})
    await ws.close()
    return ws


def _with_audio_names(send: Callable[[dict[str, Any]], None], prefix: str) -> Callable[[dict[str, Any]], None]:
    """`send`, with the speech events renamed when the clients expect vLLM-Omni 0.30's names."""
    if prefix == "response.audio":
        return send
    names = {"response.audio.delta": f"{prefix}.delta", "response.audio.done": f"{prefix}.done"}

    def send_renamed(event: dict[str, Any]) -> None:
        send({**event, "type": names.get(event.get("type", ""), event.get("type"))})

    return send_renamed


async def _serve(
    request: web.Request, kind: str, max_msg_size: int, realtime_config: dict[str, Any] | None = None
) -> web.WebSocketResponse:
    ws = web.WebSocketResponse(max_msg_size=max_msg_size)
    await ws.prepare(request)
    services, registry = Services.of(request.app), request.app[REGISTRY]
    session_id, outbox = registry.new_session_id(), Outbox(ws)
    SESSION_ID.set(session_id)
    carrier = WebSocketCarrier(outbox, services.settings.websocket_audio_events)
    try:
        session = create_session(
            kind, session_id, services, carrier, strict_reference=True, realtime_config=realtime_config
        )
    except KindNotServed as exc:
        return await _refuse(ws, str(exc))
    binding = WebSocketSession(session_id, ws, outbox, session, carrier.sink, request.transport)
    try:
        registry.add(binding)
    except SessionLimitReached as exc:
        return await _refuse(ws, str(exc))
    spend_key(request)
    try:
        await binding.serve()
    finally:
        registry.remove(binding.session_id)
    return ws


@opens_session
async def understand_stream(request: web.Request) -> web.WebSocketResponse:
    """`WS /v1/video/chat/stream`: camera frames and audio in, text and speech events out."""
    return await _serve(request, "understand", request.app[SETTINGS].max_frame_size + MESSAGE_SLACK_BYTES)


@opens_session
async def realtime_video(request: web.Request) -> web.WebSocketResponse:
    """`WS /v1/realtime/video`: a prompt in, fMP4 video chunks out."""
    return await _serve(request, "generate", START_MESSAGE_LIMIT + MESSAGE_SLACK_BYTES)


@opens_session
async def realtime_stream(request: web.Request) -> web.WebSocketResponse:
    """`WS /v1/realtime?model=...`: the OpenAI Realtime API's events, audio as base64 PCM16 24 kHz."""
    return await _serve(request, "realtime", REALTIME_MESSAGE_LIMIT, realtime_config=opening_config(request))


def add_routes(app: web.Application) -> None:
    app.router.add_get(realtime_proto.WEBSOCKET_PATH, realtime_stream)
    app.router.add_get(understand_proto.WEBSOCKET_PATH, understand_stream)
    app.router.add_get(generate_proto.WEBSOCKET_PATH, realtime_video)
