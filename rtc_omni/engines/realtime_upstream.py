"""One realtime conversation held in an upstream vLLM-Omni's duplex `/v1/realtime` session.

rtc-omni stays the conversation's authority and the server its client sees: the upstream session is
a mirror of our items, made by id (`UnderstandTurn.history_ids`). Before each response the mirror
is brought in line (items we dropped are deleted upstream, new ones created as text), the turn's
camera frames go up as `input_image` items, its audio is appended and committed explicitly
(our VAD decides turns: the upstream's turn detection is off), and `response.create` asks for the
answer. The answer's audio, transcript and usage come back as engine outputs; nothing of the
upstream's protocol reaches a client.

What the user heard is what the upstream remembers: an answer cut by an interrupt or a client's
truncation is truncated upstream to the talker's sent milliseconds (and, on vLLM-Omni, replaced by
the words heard), and an answer played out whole is acknowledged (`playback.ack`, which vLLM-Omni
waits for before it answers again).

A dropped socket is resumed (`session.resume` with the token and the last event's sequence number:
the upstream replays what was missed). When that fails, a new upstream session gets the mirrored
items again as text, and the next answer says the earlier context was lost (`ContextLost`).
docs/deployment.md ("Realtime sessions upstream") has the behaviours this follows.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import json
import logging
from collections.abc import AsyncGenerator, AsyncIterator
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlencode

import aiohttp

from ..media.pcm_resample import convert
from ..pcm import INPUT_SAMPLE_RATE, TALKER_SAMPLE_RATE, pcm16_ms, pcm16_to_float
from .engine import (
    AudioChunk,
    ContextLost,
    EngineError,
    LiveSettings,
    TextDelta,
    UnderstandOutput,
    UnderstandTurn,
    Usage,
)
from .upstream import UpstreamPool, UpstreamSocket, b64text, check_answer_length
from .upstream_session import CLOSED_MID_REQUEST, MAX_DETAIL_CHARS, too_big_message

logger = logging.getLogger(__name__)

REALTIME_PATH = "/v1/realtime"
# The upstream's answers when it serves no duplex session: vLLM's older realtime (no VAD realtime),
# or no realtime at all.
NOT_DUPLEX = ("VAD realtime is not enabled", "Realtime API is not available")
REPLY_TIMEOUT_S = 10.0  # for an upstream's answer to a request (created, committed, resumed)
RESPONSE_STALL_S = 60.0  # between two events of a running response
# vLLM-Omni takes a socket silent for its idle_timeout_s (300 s) for a dropped one: a quiet call says so.
HEARTBEAT_S = 60.0
OPENAI_PCM_RATE = 24_000  # the one rate of OpenAI's audio/pcm
APPEND_BYTES = 48_000  # at most 1 s of PCM16 per input_audio_buffer.append
MAX_IMAGES = 8  # vLLM-Omni's Qwen3-Omni duplex keeps at most 8 images per prompt
RESPONSE_EVENT_QUEUE = 256  # a full queue holds the reader (and the socket) back
LOST = "The model server's session was lost; a new one answers from the conversation's text"
_DROPPED = None  # the reader's word to a waiting response: the socket went away


class NotServed(EngineError):
    """No upstream serves duplex `/v1/realtime` (each answered that it does not)."""

    def __init__(self) -> None:
        super().__init__("no upstream serves /v1/realtime sessions")


def _is_vllm_duplex(session: object) -> bool:
    """Whether `session.created` describes vLLM-Omni's duplex session: its session object has
    `capabilities`, which OpenAI's and an rtc-omni engine process's have not (all three may give a
    resume token, and vLLM-Omni's also says `type: "realtime"`)."""
    return isinstance(session, dict) and isinstance(session.get("capabilities"), dict)


def _error_text(event: dict[str, Any]) -> str:
    """An upstream `error` event's message (vLLM-Omni nests it as OpenAI does, or gives a string)."""
    error = event.get("error")
    if isinstance(error, dict):
        said = f"{error.get('message') or ''} ({error.get('code') or error.get('type') or 'error'})"
    else:
        said = str(error or event.get("message") or "error")
    return said[:MAX_DETAIL_CHARS]


@dataclass
class _Played:
    """The last answer's audio, until its playback is acknowledged upstream."""

    response_id: str | None
    item_id: str
    sent_ms: float


@dataclass
class _Mirror:
    """Our item ids, in conversation order, with the upstream items that hold each."""

    items: dict[str, list[str]] = field(default_factory=dict)
    images: dict[str, str] = field(default_factory=dict)  # image digest -> upstream item id, oldest first

    def clear(self) -> None:
        self.items.clear()
        self.images.clear()

    def upstream_of(self, item_id: str) -> str | None:
        """The upstream item holding it (the last, for several); None for none."""
        held = self.items.get(item_id)
        return held[-1] if held else None


class RealtimeUpstreamSession:
    """The remote engine's `EngineSession` for a realtime conversation: one upstream duplex session,
    resumed when its socket drops, replaced (from the mirrored items) when it cannot be."""

    def __init__(self, pool: UpstreamPool, session_id: str, settings: LiveSettings) -> None:
        self.pool = pool
        self.session_id = session_id
        self.settings = settings
        self._socket: UpstreamSocket | None = None
        self._upstream_session: str | None = None  # the upstream's session id, for resume
        self._token: str | None = None  # a resumable upstream's (vLLM-Omni, rtc-omni); OpenAI's has none
        self._duplex = False  # vLLM-Omni's duplex session (its extensions: playback acks, 16 kHz input)
        self._seq = 0  # the last server_event_seq received
        self._mirror = _Mirror()
        self._speaking: _Played | None = None  # the running answer's audio, as it comes
        self._played: _Played | None = None
        self._context_lost: str | None = None
        self._instructions: str | None = None  # the upstream session's
        self._replies: dict[str, asyncio.Future[dict[str, Any]]] = {}  # event type -> waiter
        self._response: asyncio.Queue[dict[str, Any] | None] | None = None
        self._send_lock = asyncio.Lock()
        self._turn_lock = asyncio.Lock()
        self._tasks: set[asyncio.Task[None]] = set()  # truncations on their way
        self._keepalive: asyncio.Task[None] | None = None

    # ----------------------------------------------------------------- EngineSession

    def add_frame(self, image: bytes) -> None:
        """Unused: a realtime turn brings its own camera frames."""

    def add_audio(self, pcm16: bytes) -> None:
        """Unused: a realtime turn brings its own committed audio."""

    def truncate(self, item_id: str, audio_end_ms: int, transcript: str) -> None:
        """An answer cut to what the user heard: the upstream's is cut to match (ConversationMirror)."""
        upstream_id = self._mirror.upstream_of(item_id)
        if upstream_id is None:
            return
        if self._played is not None and self._played.item_id == upstream_id:
            self._played = None  # a truncation acknowledges the answer's playback (vLLM-Omni says so)
        self._spawn(self._truncate_upstream(item_id, upstream_id, audio_end_ms, transcript))

    async def close(self) -> None:
        tasks = [*self._tasks, *([self._keepalive] if self._keepalive is not None else [])]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        socket, self._socket = self._socket, None
        if socket is not None:
            await self._send(socket, {"type": "session.close"}, quiet=True)
            await self._release(socket)

    # ----------------------------------------------------------------- a response

    async def answer(self, turn: UnderstandTurn) -> AsyncGenerator[UnderstandOutput, None]:
        """One response: the mirror brought in line, the turn's input, the answer streamed back."""
        async with self._turn_lock:
            socket = await self._connected()
            if self._context_lost is not None:
                yield ContextLost(self._context_lost)
                self._context_lost = None
            await self._acknowledge(socket)
            await self._sync(socket, turn)
            await self._send_input(socket, turn)
            await self._instruct(socket, turn.system_prompt)
            queue: asyncio.Queue[dict[str, Any] | None] = asyncio.Queue(RESPONSE_EVENT_QUEUE)
            self._response = queue
            done = False
            try:
                await self._send(socket, self._response_create(turn))
                async for output in self._outputs(turn, queue):
                    yield output
                done = True
            finally:
                self._response = None
                while not queue.empty():  # a reader waiting to put into it goes on (and drops the rest)
                    queue.get_nowait()
                speaking, self._speaking = self._speaking, None
                if speaking is not None and speaking.sent_ms > 0:
                    self._played = speaking  # its playback is acknowledged before the next answer
                if not done and self._socket is not None:
                    # Interrupted: the upstream stops generating now (the truncation follows from the talker).
                    await self._send(self._socket, {"type": "response.cancel"}, quiet=True)

    def _response_create(self, turn: UnderstandTurn) -> dict[str, Any]:
        response: dict[str, Any] = {"output_modalities": ["audio"] if "audio" in turn.modalities else ["text"]}
        return {"type": "response.create", "response": response}

    async def _instruct(self, socket: UpstreamSocket, instructions: str | None) -> None:
        """The response's instructions, as the session's: vLLM-Omni's duplex runtime refuses them on
        `response.create` (`unsupported_native_response_options`)."""
        if instructions == self._instructions:
            return
        update = {"type": "session.update", "session": {"type": "realtime", "instructions": instructions or ""}}
        await self._request(socket, update, "session.updated")
        self._instructions = instructions

    async def _outputs(
        self, turn: UnderstandTurn, queue: asyncio.Queue[dict[str, Any] | None]
    ) -> AsyncIterator[UnderstandOutput]:
        """The response's events as engine outputs, up to `response.done`; resumes a dropped socket."""
        chars = 0
        while True:
            try:
                async with asyncio.timeout(RESPONSE_STALL_S):
                    event = await queue.get()
            except TimeoutError:
                raise EngineError(f"the upstream sent nothing for {RESPONSE_STALL_S:.0f} s") from None
            if event is _DROPPED:
                if not await self._resume():
                    raise EngineError(CLOSED_MID_REQUEST)
                continue
            kind = event.get("type")
            if kind == "error":
                raise EngineError(f"upstream: {_error_text(event)}")
            if kind == "response.output_item.added":
                item = event.get("item")
                if isinstance(item, dict) and isinstance(item.get("id"), str) and self._speaking is None:
                    response_id = event.get("response_id")
                    self._speaking = _Played(response_id if isinstance(response_id, str) else None, item["id"], 0.0)
                    if turn.output_id is not None:
                        self._mirror.items[turn.output_id] = [item["id"]]
            elif kind in ("response.output_audio_transcript.delta", "response.output_text.delta"):
                delta = event.get("delta")
                if isinstance(delta, str) and delta:
                    chars += len(delta)
                    check_answer_length(chars)
                    yield TextDelta(delta)
            elif kind == "response.output_audio.delta":
                delta = event.get("delta")
                if isinstance(delta, str) and delta:
                    try:
                        pcm16 = base64.b64decode(delta, validate=True)
                    except ValueError:
                        raise EngineError("the upstream sent audio that is not base64") from None
                    if len(pcm16) % 2:
                        raise EngineError("the upstream sent audio that is not PCM16")
                    if self._speaking is not None:
                        self._speaking.sent_ms += pcm16_ms(pcm16, TALKER_SAMPLE_RATE)
                    yield AudioChunk(pcm16_to_float(pcm16))
            elif kind == "response.done":
                response = event.get("response")
                response = response if isinstance(response, dict) else {}
                if response.get("status") == "failed":
                    raise EngineError(f"upstream: the response failed: {str(response.get('status_details'))[:200]}")
                usage = _usage(response.get("usage"))
                if usage is not None:
                    yield usage
                return

    # ----------------------------------------------------------------- the mirror and the input

    async def _sync(self, socket: UpstreamSocket, turn: UnderstandTurn) -> None:
        """Delete upstream what our conversation no longer has; create what the upstream lacks."""
        wanted = set(turn.history_ids) | set(turn.input_ids)
        for item_id in [i for i in self._mirror.items if i not in wanted]:
            for upstream_id in self._mirror.items.pop(item_id):
                await self._send(socket, {"type": "conversation.item.delete", "item_id": upstream_id})
        previous: str | None = None
        for item_id, message in zip(turn.history_ids, turn.history, strict=True):
            if item_id not in self._mirror.items:
                words = str(message.get("content") or "")
                created = await self._create(socket, _history_item(message["role"], words), previous) if words else None
                self._mirror.items[item_id] = [created] if created is not None else []
            previous = self._mirror.upstream_of(item_id) or previous

    async def _send_input(self, socket: UpstreamSocket, turn: UnderstandTurn) -> None:
        """The turn's camera frames (new ones), its text and its committed audio."""
        held: list[str] = []
        for frame in turn.frames[-MAX_IMAGES:]:
            digest = hashlib.md5(frame.jpeg, usedforsecurity=False).hexdigest()
            if digest in self._mirror.images:
                continue
            url = "data:image/jpeg;base64," + b64text(frame.jpeg)
            created = await self._create(socket, _user_item({"type": "input_image", "image_url": url}))
            if created is not None:
                self._mirror.images[digest] = created
        while len(self._mirror.images) > MAX_IMAGES:  # a rolling window of the newest, as the model sees them
            oldest = next(iter(self._mirror.images))
            await self._send(socket, {"type": "conversation.item.delete", "item_id": self._mirror.images.pop(oldest)})
        if turn.query:
            created = await self._create(socket, _user_item({"type": "input_text", "text": turn.query}))
            if created is not None:
                held.append(created)
        if turn.audio_pcm16:
            audio = turn.audio_pcm16
            if self._input_rate != INPUT_SAMPLE_RATE:
                audio = await asyncio.to_thread(convert, audio, INPUT_SAMPLE_RATE, self._input_rate)
            for start in range(0, len(audio), APPEND_BYTES):
                chunk = audio[start : start + APPEND_BYTES]
                await self._send(socket, {"type": "input_audio_buffer.append", "audio": b64text(chunk)})
            committed = await self._request(
                socket, {"type": "input_audio_buffer.commit"}, "input_audio_buffer.committed"
            )
            if isinstance(committed.get("item_id"), str):
                held.append(committed["item_id"])
        if held and turn.input_ids:
            for item_id in turn.input_ids:
                self._mirror.items[item_id] = held

    async def _create(self, socket: UpstreamSocket, item: dict[str, Any], previous: str | None = None) -> str | None:
        """conversation.item.create; the upstream's id for the item, or None when it refused it."""
        message: dict[str, Any] = {"type": "conversation.item.create", "item": item}
        if previous is not None:
            message["previous_item_id"] = previous
        try:
            added = await self._request(socket, message, "conversation.item.added")
        except EngineError as exc:
            logger.info("session %s: upstream refused an item: %s", self.session_id, exc)
            return None
        created = added.get("item")
        return created.get("id") if isinstance(created, dict) and isinstance(created.get("id"), str) else None

    async def _acknowledge(self, socket: UpstreamSocket) -> None:
        """playback.ack for the last answer, played out whole (vLLM-Omni answers again after); one cut
        short was acknowledged by its truncation."""
        played, self._played = self._played, None
        if played is None or not self._duplex:
            return
        ack = {"type": "playback.ack", "item_id": played.item_id, "played_ms": int(played.sent_ms)}
        if played.response_id is not None:
            ack["response_id"] = played.response_id
        await self._send(socket, ack)

    async def _truncate_upstream(self, item_id: str, upstream_id: str, audio_end_ms: int, transcript: str) -> None:
        async with self._turn_lock:  # before the next response's input
            socket = self._socket
            if socket is None or socket.closing or socket.ws.closed:
                return  # the next response brings the upstream in line
            if self._duplex:  # it keeps a finished answer's audio queued for playback: cleared first, or it waits
                await self._send(socket, {"type": "output_audio_buffer.clear"}, quiet=True)
            truncate = {"type": "conversation.item.truncate", "item_id": upstream_id, "content_index": 0}
            await self._send(socket, {**truncate, "audio_end_ms": audio_end_ms}, quiet=True)
            if not self._duplex:
                return
            # vLLM-Omni keeps a cancelled answer as an empty message, and a truncated one whole: its
            # item is replaced by the words that were heard.
            previous = self._previous_upstream(item_id)
            await self._send(socket, {"type": "conversation.item.delete", "item_id": upstream_id}, quiet=True)
            created = (
                await self._create(socket, _history_item("assistant", transcript), previous) if transcript else None
            )
            self._mirror.items[item_id] = [created] if created is not None else []

    def _previous_upstream(self, item_id: str) -> str | None:
        """The upstream item before ours, in conversation order."""
        previous = None
        for mirrored, held in self._mirror.items.items():
            if mirrored == item_id:
                return previous
            previous = held[-1] if held else previous
        return previous

    # ----------------------------------------------------------------- the socket

    async def _connected(self) -> UpstreamSocket:
        """The live socket: resumed when it dropped, a new upstream session when that fails."""
        if self._socket is not None and not self._socket.ws.closed and not self._socket.closing:
            return self._socket
        if self._socket is not None and await self._resume():
            assert self._socket is not None
            return self._socket
        return await self._open_new()

    async def _open_new(self) -> UpstreamSocket:
        """A fresh upstream session on an upstream that serves duplex realtime, configured for us."""
        if self._socket is not None:
            await self._release(self._socket)
            self._socket = None
        if self._mirror.items and self._context_lost is None:
            self._context_lost = LOST
        self._mirror.clear()
        self._played = None
        self._seq = 0  # a new session numbers its events from 1
        self._instructions = self.settings.system_prompt  # the first session.update's
        for _ in range(len(self.pool.upstreams)):
            if not any(u.serves for u in self.pool.upstreams):
                break
            try:
                upstream, ws = await self.pool.open(self._query(new=True))
            except EngineError:
                if any(u.serves for u in self.pool.upstreams):
                    raise
                break  # each one that answered lacks the endpoint
            socket = UpstreamSocket(upstream, ws)
            # vLLM-Omni opens a session at the first message that is no resume (without ?model=, none sooner).
            await self._send(socket, self._session_update())
            created = await self._first_event(socket)
            if created is None:
                continue  # it serves no duplex sessions: marked, the next one is tried
            self._upstream_session = str((created.get("session") or {}).get("id") or created.get("session_id") or "")
            self._token = created.get("resume_token") if isinstance(created.get("resume_token"), str) else None
            self._duplex = _is_vllm_duplex(created.get("session"))
            self._start_reader(socket)
            if self._duplex and self._keepalive is None:
                self._keepalive = asyncio.get_running_loop().create_task(self._heartbeat())
            # The input's rate, now that it is known which kind of server this is.
            audio_in = {"input": {"format": {"type": "audio/pcm", "rate": self._input_rate}}}
            await self._request(
                socket,
                {"type": "session.update", "session": {"type": "realtime", "audio": audio_in}},
                "session.updated",
            )
            logger.info("session %s: upstream realtime session on %s", self.session_id, upstream.url)
            return socket
        raise NotServed()

    async def _first_event(self, socket: UpstreamSocket) -> dict[str, Any] | None:
        """`session.created`, or None (the upstream marked as not serving) when it serves no duplex."""
        try:
            async with asyncio.timeout(REPLY_TIMEOUT_S):
                event = await self._receive(socket)
        except TimeoutError:
            event = None
        if event is not None and event.get("type") == "session.created":
            self._note_seq(event)
            return event
        said = _error_text(event) if event is not None else "no session.created"
        await self._release(socket)
        if any(marker in said for marker in NOT_DUPLEX):
            logger.info("upstream %s serves no duplex realtime: %s", socket.upstream.url, said)
            self.pool.mark_not_serving(socket.upstream)
            return None
        self.pool.mark_down(socket.upstream)
        raise EngineError(f"upstream: {said}")

    def _query(self, new: bool) -> str:
        params = {"duplex": "1"}
        if new and self.settings.model:
            params["model"] = self.settings.model
        if not new:
            params["resume"] = "1"  # vLLM-Omni's own client marks a resume so
        return "?" + urlencode(params)

    @property
    def _input_rate(self) -> int:
        return INPUT_SAMPLE_RATE if self._duplex else OPENAI_PCM_RATE

    def _session_update(self) -> dict[str, Any]:
        session: dict[str, Any] = {
            "type": "realtime",
            "output_modalities": ["audio"] if "audio" in self.settings.modalities else ["text"],
            "audio": {
                "input": {"turn_detection": None},
                "output": {"format": {"type": "audio/pcm", "rate": TALKER_SAMPLE_RATE}},
            },
        }
        if self.settings.system_prompt:
            session["instructions"] = self.settings.system_prompt
        return {"type": "session.update", "session": session}

    async def _resume(self) -> bool:
        """Resume the upstream session on a new socket to the same upstream; False when it cannot be."""
        old = self._socket
        if old is None or self._upstream_session is None or self._token is None:
            return False
        await self._release(old)
        try:
            _, ws = await self.pool.open(self._query(new=False), only=old.upstream)
        except EngineError:
            self._socket = None
            return False
        socket = UpstreamSocket(old.upstream, ws)
        resume = {
            "type": "session.resume",
            "session_id": self._upstream_session,
            "resume_token": self._token,
            "last_received_server_event_seq": self._seq,
        }
        await self._send(socket, resume, quiet=True)
        try:
            async with asyncio.timeout(REPLY_TIMEOUT_S):
                event = await self._receive(socket)
        except TimeoutError:
            event = None
        if event is None or event.get("type") != "session.resumed":
            logger.warning(
                "session %s: upstream %s did not resume: %s",
                self.session_id,
                old.upstream.url,
                _error_text(event) if event else "no answer",
            )
            await self._release(socket)
            self._socket = None
            return False
        self._note_seq(event)
        if isinstance(event.get("resume_token"), str):
            self._token = event["resume_token"]
        self._start_reader(socket)
        logger.info("session %s: upstream %s resumed", self.session_id, old.upstream.url)
        return True

    async def _heartbeat(self) -> None:
        while True:
            await asyncio.sleep(HEARTBEAT_S)
            socket = self._socket
            if socket is not None and not socket.ws.closed and not socket.closing:
                await self._send(socket, {"type": "session.heartbeat"}, quiet=True)

    def _start_reader(self, socket: UpstreamSocket) -> None:
        self._socket = socket
        socket.reader = asyncio.get_running_loop().create_task(self._read(socket))

    async def _read(self, socket: UpstreamSocket) -> None:
        """Route the socket's events: replies to their waiters, the rest to the running response."""
        while True:
            event = await self._receive(socket)
            if event is None:
                break
            seq = event.get("server_event_seq")
            if isinstance(seq, int) and seq <= self._seq:
                continue  # replayed on resume, and seen before
            self._note_seq(event)
            kind = event.get("type")
            waiter = self._replies.pop(kind, None) if isinstance(kind, str) else None
            if waiter is not None and not waiter.done():
                waiter.set_result(event)
            elif kind == "error" and self._replies:
                for pending in list(self._replies.values()):
                    if not pending.done():
                        pending.set_result(event)
                self._replies.clear()
            elif self._response is not None:
                await self._response.put(event)
            elif kind == "error":
                logger.info("session %s: upstream error outside a response: %s", self.session_id, _error_text(event))
        if not socket.closing:
            logger.warning("session %s: upstream %s closed the connection", self.session_id, socket.upstream.url)
            for pending in self._replies.values():
                if not pending.done():
                    pending.set_result({"type": "error", "error": {"message": CLOSED_MID_REQUEST}})
            self._replies.clear()
            if self._response is not None:
                await self._response.put(_DROPPED)

    async def _receive(self, socket: UpstreamSocket) -> dict[str, Any] | None:
        """The next JSON event; None when the socket closed (or sent what is no event)."""
        message = await socket.ws.receive()
        if message.type == aiohttp.WSMsgType.TEXT:
            try:
                event = json.loads(message.data)
            except ValueError:
                return {"type": "error", "error": {"message": "the upstream sent a message that is no JSON"}}
            return event if isinstance(event, dict) else {"type": "error", "error": {"message": "not an object"}}
        if message.type == aiohttp.WSMsgType.ERROR and getattr(message.data, "code", None) == 1009:
            logger.warning("session %s: %s", self.session_id, too_big_message(self.pool.max_message_bytes))
        return None

    def _note_seq(self, event: dict[str, Any]) -> None:
        seq = event.get("server_event_seq")
        if isinstance(seq, int):
            self._seq = max(self._seq, seq)

    async def _request(self, socket: UpstreamSocket, message: dict[str, Any], reply: str) -> dict[str, Any]:
        """Send, and wait for the upstream's `reply` event (EngineError for an error or no answer)."""
        waiter: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        self._replies[reply] = waiter
        await self._send(socket, message)
        try:
            async with asyncio.timeout(REPLY_TIMEOUT_S):
                event = await waiter
        except TimeoutError:
            raise EngineError(f"the upstream did not answer {message['type']}") from None
        finally:
            self._replies.pop(reply, None)
        if event.get("type") == "error":
            raise EngineError(f"upstream: {_error_text(event)}")
        return event

    async def _send(self, socket: UpstreamSocket, message: dict[str, Any], quiet: bool = False) -> None:
        """Send one event; a failure closes the socket (the reader tells a waiting response) and,
        unless `quiet`, is an EngineError."""
        try:
            async with self._send_lock:
                await socket.ws.send_json(message)
        except (aiohttp.ClientError, ConnectionError) as exc:
            logger.warning("session %s: upstream %s send failed: %s", self.session_id, socket.upstream.url, exc)
            await socket.ws.close()
            if not quiet:
                raise EngineError(CLOSED_MID_REQUEST) from exc

    async def _release(self, socket: UpstreamSocket) -> None:
        socket.closing = True
        await self.pool.release(socket.upstream, socket.ws)
        if socket.reader is not None and socket.reader is not asyncio.current_task():
            socket.reader.cancel()
            await asyncio.gather(socket.reader, return_exceptions=True)

    def _spawn(self, work: Any) -> None:
        task = asyncio.get_running_loop().create_task(work)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)


def _user_item(part: dict[str, Any]) -> dict[str, Any]:
    return {"type": "message", "role": "user", "content": [part]}


def _history_item(role: str, text: str) -> dict[str, Any]:
    """A chat message's words as an upstream item (a tool's output as the user's text: Qwen's duplex
    has no tools)."""
    if role == "assistant":
        return {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": text}]}
    if role == "system":
        return {"type": "message", "role": "system", "content": [{"type": "input_text", "text": text}]}
    return _user_item({"type": "input_text", "text": text})


def _usage(report: object) -> Usage | None:
    """OpenAI's response usage as the engine's `Usage` (what the upstream does not count, None)."""
    if not isinstance(report, dict) or not isinstance(report.get("input_tokens"), int):
        return None
    given = report.get("input_token_details")
    inputs: dict[str, Any] = given if isinstance(given, dict) else {}
    given = report.get("output_token_details")
    outputs: dict[str, Any] = given if isinstance(given, dict) else {}
    return Usage(
        input_tokens=report["input_tokens"],
        output_tokens=int(report.get("output_tokens") or 0),
        input_text_tokens=inputs.get("text_tokens"),
        input_audio_tokens=inputs.get("audio_tokens"),
        input_image_tokens=inputs.get("image_tokens"),
        input_cached_tokens=inputs.get("cached_tokens"),
        output_text_tokens=outputs.get("text_tokens"),
        output_audio_tokens=outputs.get("audio_tokens"),
    )
