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
import logging
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from aiohttp import WSCloseCode, WSMsgType, web
from pydantic import BaseModel, ValidationError
from pydantic import Field as PydanticField

from ..logs import SESSION_ID
from ..media.fmp4_sink import Fmp4ChunkSink
from ..protocol import generate_messages as generate_proto
from ..protocol import realtime_events as realtime_proto
from ..protocol import understand_messages as understand_proto
from ..protocol.codec import load_json
from ..protocol.validation import describe_validation_error
from ..sessions.journal import (
    INVALID_RESUME,
    RESUME_EXPIRED,
    UNSUPPORTED_RESUME,
    Resumable,
    ResumeRefused,
    dumps,
    envelope,
    resumable_session,
)
from ..sessions.registry import SessionLimitReached
from ..tasks import TaskSet
from .capabilities import resume_headers
from .client_secrets import opening_config, spend_key
from .factory import AnySession, KindNotServed, Services, create_session
from .keys import REGISTRY, SETTINGS, SOCKET_RELAY
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
HEARTBEAT_S = 10.0  # with resume on: a socket lost without a close is noticed (and detached) within 1.5 x this
RESUME_PARAMETER = "resume"  # ?resume=1: the first message may be session.resume (vLLM-Omni's client sets it)
MAX_RESUME_CHARS = 4096
REPLACED = "session_replaced"


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
        self.abandoned = False

    async def wait_room(self) -> None:
        """Wait (bounded) until a binary message may be queued, or the socket is given up."""
        async with asyncio.timeout(SEND_TIMEOUT_S):
            while self.unsent_bytes > self.max_bytes // 2 and not self.abandoned:
                await self._wait_sent()

    def abandon(self) -> None:
        """The socket is gone (lost, or taken over): nothing more is queued, and no one waits for room."""
        self.abandoned = True
        self._sent.set()

    def put(self, item: str | bytes) -> None:
        if self.overflowed.is_set() or self.abandoned:
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
    generated video as fMP4 binary messages, each announced by its event (media/fmp4_sink.py).

    It lives as long as its session: the socket it writes to comes and goes (`attach`, `detach`);
    with resume on, every message is journaled as it is queued (sessions/journal.py), and while no
    socket is attached it is journaled only.
    """

    def __init__(self, audio_events: str, resumable: Resumable | None) -> None:
        self._outbox: Outbox | None = None
        self._rename = _audio_renamer(audio_events)
        self.resumable = resumable
        self.sink: Fmp4ChunkSink | None = None

    def attach(self, outbox: Outbox | None) -> None:
        self._outbox = outbox

    def send(self, event: dict[str, Any]) -> None:
        if self.sink is not None:
            self.sink.send_event(event)  # in order with the video's binary messages
        else:
            self._send_json(event)

    def _send_json(self, event: dict[str, Any]) -> None:
        event = self._rename(event)
        text = dumps(event) if self.resumable is None else self.resumable.stamp(event)
        if self._outbox is not None:
            self._outbox.put(text)

    async def _send_bytes(self, data: bytes) -> None:
        if self._outbox is not None:
            await self._outbox.wait_room()
        if self.resumable is not None:
            self.resumable.record_bytes(data)
        if self._outbox is not None:  # the socket may have gone while the message waited
            self._outbox.put(data)

    def talker(self) -> None:
        return None

    def video(self) -> Fmp4ChunkSink:
        self.sink = Fmp4ChunkSink(self._send_json, self._send_bytes)
        return self.sink


@dataclass
class _Socket:
    """One WebSocket carrying the session, and how it ended."""

    ws: web.WebSocketResponse
    outbox: Outbox
    transport: asyncio.Transport | None
    replaced: asyncio.Event = field(default_factory=asyncio.Event)
    said_goodbye: bool = False  # a closing handshake, or session.close: the client ended the session

    async def close(self, code: int = WSCloseCode.OK, reason: str = "") -> None:
        """Close the socket, bounded in time: a client that stopped reading is told why if it takes
        the close frame within CLOSE_TIMEOUT_S; then the connection and what it holds are dropped."""
        try:
            async with asyncio.timeout(CLOSE_TIMEOUT_S):
                await self.ws.close(code=code, message=reason.encode())
        except TimeoutError:
            if self.transport is not None:
                self.transport.abort()


class WebSocketSession:
    """One session and the WebSocket that carries it now; registered like a peer session.

    Without resume the session ends with its socket. With resume a socket lost without a closing
    handshake detaches the session, which goes on (journaling what it says) for --resume-grace, and a
    new socket that presents the resume token takes it over (`resume`).
    """

    def __init__(
        self,
        session_id: str,
        session: AnySession,
        carrier: WebSocketCarrier,
        on_closed: Callable[[WebSocketSession], None],
    ) -> None:
        self.session_id = session_id
        self.kind = session.kind
        self.session = session
        self.carrier = carrier
        self.resumable = carrier.resumable
        self._on_closed = on_closed
        self._socket: _Socket | None = None
        self._started = False
        self.closed = asyncio.Event()

    async def serve(self, socket: _Socket, first: Sequence[str | bytes] = (), then: str | None = None) -> None:
        """Carry the session on `socket` until it ends, the client leaves, or another socket takes
        over: `first` goes out before anything else, `then` is the client's first message."""
        previous, self._socket = self._socket, socket
        if previous is not None:
            previous.replaced.set()
            if self.resumable is not None:
                previous.outbox.put(self.resumable.replaced_event())
        for item in first:
            socket.outbox.put(item)
        self.carrier.attach(socket.outbox)
        if self.resumable is not None:
            self.resumable.attach()
            self.session.connection_changed()
        tasks = TaskSet()
        tasks.spawn(socket.outbox.run())
        if not self._started:
            self._started = True
            self.session.start()
        if then is not None:
            self._receive(socket, then)
        reader = tasks.spawn(self._read(socket))
        ended = asyncio.ensure_future(self.session.closed.wait())
        overflow = asyncio.ensure_future(socket.outbox.overflowed.wait())
        replaced = asyncio.ensure_future(socket.replaced.wait())
        try:
            await asyncio.wait([reader, ended, overflow, replaced], return_when=asyncio.FIRST_COMPLETED)
        finally:
            for waiter in (ended, overflow, replaced):
                waiter.cancel()
            if socket.replaced.is_set():
                await self._give_up(socket, tasks, WSCloseCode.OK, REPLACED)
            elif self._lost(socket):
                await self._detach(socket, tasks)
            else:
                await self.close()
                await tasks.cancel_all()

    def _lost(self, socket: _Socket) -> bool:
        """The connection went without a goodbye, and the session may wait for its client."""
        return (
            self.resumable is not None
            and not socket.said_goodbye
            and not socket.outbox.overflowed.is_set()
            and not self.session.closed.is_set()
            and not self.closed.is_set()
        )

    async def _read(self, socket: _Socket) -> None:
        while not socket.said_goodbye:
            message = await socket.ws.receive()
            current = socket is self._socket
            if message.type in (WSMsgType.TEXT, WSMsgType.BINARY) and current and self.resumable is not None:
                # The client is there and read session.resumed: the token it resumed with is spent
                # (until then it still works, should this socket drop before the new one arrived).
                self.resumable.confirm()
            if message.type == WSMsgType.TEXT:
                self._receive(socket, message.data)
            elif message.type == WSMsgType.BINARY:
                self.session.receive_binary(message.data)
            else:
                socket.said_goodbye = socket.said_goodbye or message.type == WSMsgType.CLOSE
                return

    def _receive(self, socket: _Socket, text: str) -> None:
        """A client message: resume's envelope is answered here, the rest is the session's."""
        message = envelope(text) if self.resumable is not None else None
        if message is None:
            self.session.receive_text(text)
            return
        assert self.resumable is not None
        answer = self.resumable.answer_envelope(message)
        if answer is not None:
            socket.outbox.put(answer)
        if message["type"] == "session.close":
            socket.said_goodbye = True  # the reader stops, and the session ends

    async def _detach(self, socket: _Socket, tasks: TaskSet) -> None:
        """The socket was lost: the session goes on, journaling, until it is resumed or its grace ends."""
        assert self.resumable is not None
        self._socket = None
        self.carrier.attach(None)
        self.resumable.detach(self.close)
        self.session.connection_changed()
        socket.outbox.abandon()
        await tasks.cancel_all()
        if socket.transport is not None:
            socket.transport.abort()

    async def _give_up(self, socket: _Socket, tasks: TaskSet, code: int, reason: str) -> None:
        """Let this socket's last events (session.replaced) leave, then close it; the session goes on."""
        await socket.outbox.drain(DRAIN_TIMEOUT_S)
        socket.outbox.abandon()
        await tasks.cancel_all()
        await socket.close(code, reason)

    def resume(self, token: str, last_seq: int, allow_resync: bool) -> list[str | bytes]:
        """Check a resume and return what the new socket gets first (sessions/journal.py)."""
        if self.resumable is None or self.closed.is_set():
            raise ResumeRefused(RESUME_EXPIRED, f"unknown or expired session: {self.session_id}")
        return self.resumable.resume(token, last_seq, allow_resync)

    async def close(self) -> None:
        """Close the session, let its last events leave, then close the socket; idempotent."""
        if self.closed.is_set():
            return
        self.closed.set()
        if self.resumable is not None:
            self.resumable.close()
        await self.session.close()
        socket, self._socket = self._socket, None
        if socket is not None:
            if not socket.outbox.overflowed.is_set():
                await socket.outbox.drain(DRAIN_TIMEOUT_S)
            overflowed = socket.outbox.overflowed.is_set()
            code = WSCloseCode.POLICY_VIOLATION if overflowed else WSCloseCode.OK
            await socket.close(code, NOT_READING if overflowed else "")
        if self.carrier.sink is not None:
            self.carrier.sink.close()
        self._on_closed(self)

    async def stats(self) -> dict[str, Any]:
        resume = {} if self.resumable is None else self.resumable.stats()
        return {"session_id": self.session_id, **self.session.stats(), **resume, "transport": "websocket"}


def _error_event(message: str, code: str | None = None) -> dict[str, Any]:
    """An `error` read by every protocol's clients: the reference's `message`, and OpenAI's `error`."""
    if code is None:
        return {"type": "error", "message": message}
    detail = {"type": "invalid_request_error", "code": code, "message": message}
    return {"type": "error", "message": message, "code": code, "error": detail}


async def _refuse(ws: web.WebSocketResponse, message: str, code: str | None = None) -> web.WebSocketResponse:
    """The reference's answer when it cannot serve: accept, send one `error`, close."""
    await ws.send_json(_error_event(message, code))
    await ws.close()
    return ws


def _audio_renamer(prefix: str) -> Callable[[dict[str, Any]], dict[str, Any]]:
    """The speech events renamed when the clients expect vLLM-Omni 0.30's names."""
    if prefix == "response.audio":
        return lambda event: event
    names = {"response.audio.delta": f"{prefix}.delta", "response.audio.done": f"{prefix}.done"}
    return lambda event: {**event, "type": names.get(event.get("type", ""), event.get("type"))}


class ResumeRequest(BaseModel):
    """`session.resume`, the first message of a `?resume=1` socket (vLLM-Omni's shape)."""

    type: Literal["session.resume"]
    session_id: str = PydanticField(max_length=256)
    resume_token: str = PydanticField(max_length=256)
    last_received_server_event_seq: int = PydanticField(0, ge=0)
    allow_resync: bool = False


async def _first_message(ws: web.WebSocketResponse, timeout: float) -> str | None:
    """A `?resume=1` socket's first text message, or None (it sent none in time, or closed)."""
    try:
        async with asyncio.timeout(timeout):
            message = await ws.receive()
    except TimeoutError:
        return None
    return message.data if message.type == WSMsgType.TEXT else None


async def _resume(request: web.Request, ws: web.WebSocketResponse, kind: str, raw: str) -> web.WebSocketResponse:
    """Take a session over on this socket, or refuse with vLLM-Omni's error codes and close."""
    try:
        asked = ResumeRequest.model_validate(load_json(raw))
    except (ValueError, ValidationError) as exc:
        detail = describe_validation_error(exc) if isinstance(exc, ValidationError) else str(exc)
        return await _refuse(ws, f"invalid session.resume: {detail}", INVALID_RESUME)
    binding = request.app[REGISTRY].get(asked.session_id)
    relay = request.app.get(SOCKET_RELAY)
    if binding is None and relay is not None and await relay.relay_websocket(request, ws, raw, asked.session_id):
        return ws
    try:
        if binding is None:
            raise ResumeRefused(RESUME_EXPIRED, f"unknown or expired session: {asked.session_id}")
        if not isinstance(binding, WebSocketSession) or binding.kind != kind:
            raise ResumeRefused(UNSUPPORTED_RESUME, "this session is not a WebSocket session of this endpoint")
        first = binding.resume(asked.resume_token, asked.last_received_server_event_seq, asked.allow_resync)
    except ResumeRefused as exc:
        return await _refuse(ws, str(exc), exc.code)
    SESSION_ID.set(binding.session_id)
    await binding.serve(_Socket(ws, Outbox(ws), request.transport), first)
    return ws


def _is_resume(raw: str) -> bool:
    """Whether a `?resume=1` socket's first message is `session.resume` (a small message; any other
    opens a new session, as vLLM-Omni does)."""
    if len(raw) > MAX_RESUME_CHARS:
        return False
    try:
        message = load_json(raw)
    except ValueError:
        return False
    return isinstance(message, dict) and message.get("type") == "session.resume"


async def _serve(
    request: web.Request, kind: str, max_msg_size: int, realtime_config: dict[str, Any] | None = None
) -> web.WebSocketResponse:
    services, registry = Services.of(request.app), request.app[REGISTRY]
    settings = services.settings
    ws = web.WebSocketResponse(max_msg_size=max_msg_size, heartbeat=HEARTBEAT_S if settings.resume_grace else None)
    resuming = request.query.get(RESUME_PARAMETER) == "1" and settings.resume_grace > 0
    session_id = registry.new_session_id()
    SESSION_ID.set(session_id)
    resumable = resumable_session(settings, session_id)
    if not resuming:  # a ?resume=1 socket may resume another session: its session.resumed says which
        ws.headers.update(resume_headers(session_id, resumable))
    await ws.prepare(request)
    then: str | None = None
    if resuming:
        then = await _first_message(ws, settings.config_timeout)
        if then is None:
            return await _refuse(ws, "a ?resume=1 socket must send session.resume (or a first message) in time")
        if _is_resume(then):
            return await _resume(request, ws, kind, then)
    carrier = WebSocketCarrier(settings.websocket_audio_events, resumable)
    try:
        session = create_session(
            kind, session_id, services, carrier, strict_reference=True, realtime_config=realtime_config
        )
    except KindNotServed as exc:
        return await _refuse(ws, str(exc))
    binding = WebSocketSession(session_id, session, carrier, lambda b: registry.remove(b.session_id))
    try:
        registry.add(binding)
    except SessionLimitReached as exc:
        return await _refuse(ws, str(exc))
    spend_key(request)
    await binding.serve(_Socket(ws, Outbox(ws), request.transport), then=then)
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
