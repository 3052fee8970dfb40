"""The skeleton every session stands on, whatever its protocol: lifecycle, message loop, emit, close.

A protocol is a codec (a module of protocol/: raw text in, one typed message or a `Refusal` out)
plus a state machine over this skeleton (sessions/<name>.py). The state machine implements
`_decode` (its codec), `_handle` (one typed client message), `_do` (one of its own work items),
`_error` (an `error` event in its protocol's shape), `stats`, and the hooks for its clocks and its
teardown. The skeleton owns the rest: the inbox and the one loop that handles it in order, the
last-message clock, `emit` with error counting, `notify`, closing from inside its own tasks, and
engine aborts bounded in time. It never touches a transport: events leave through `send`.
"""

from __future__ import annotations

import asyncio
import logging
import time
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, Generic, Protocol, TypeVar

from .. import metrics
from ..config import Settings
from ..protocol.codec import (
    MESSAGE_QUEUE_FULL,
    TEXT_NOT_UTF8,
    Refusal,
    ServerEvent,
    TypedMessage,
    event_too_large,
    internal_error,
)
from ..tasks import TaskSet
from .inbox import Inbox, WorkItem

if TYPE_CHECKING:
    from ..media.ingest import MediaSink

logger = logging.getLogger(__name__)

ENGINE_CALL_TIMEOUT_S = 5.0  # an engine's abort or interact call
CANCEL_WAIT_S = 5.0  # a cancelled task of the session unwinding
MAX_WORK_ITEMS = 16
# Client messages waiting, as received: four of the largest a WebSocket takes (16 MiB), however many
# are allowed by count (a DataChannel message is at most 1 MiB).
MAX_INBOX_BYTES = 64 * 1024 * 1024

Send = Callable[[dict[str, Any]], None]


class Abortable(Protocol):
    """The engine call every session needs: drop an unfinished request."""

    async def abort(self, request_id: str) -> None: ...


M = TypeVar("M", bound=TypedMessage)
E = TypeVar("E", bound=Abortable)


@dataclass(kw_only=True)
class Session(ABC, Generic[M, E]):
    """One session of any protocol: `start`, `receive_text` / `receive_binary`, `notify`, `close`.

    `strict_reference` gives the reference's session semantics where ours differ (the WebSocket
    endpoints set it, docs/websocket.md): the errors its codec marks so end the session.
    """

    kind: ClassVar[str]
    max_messages: ClassVar[int]  # client messages waiting in the inbox
    binary_refusal: ClassVar[Refusal]  # the protocol's answer to a binary message

    session_id: str
    settings: Settings
    engine: E
    send: Send
    on_closed: Callable[[], None] | None = None
    strict_reference: bool = False

    def __post_init__(self) -> None:
        self.closed = asyncio.Event()
        self.errors_sent = 0
        self._inbox: Inbox[M] = Inbox(self.max_messages, MAX_WORK_ITEMS, MAX_INBOX_BYTES)
        self._tasks = TaskSet()
        self._closing = False
        self._closer: asyncio.Task[None] | None = None
        self._last_activity = self._waiting_since = time.monotonic()

    # ----------------------------------------------------------------- lifecycle

    def start(self) -> None:
        self._tasks.spawn(self._process_messages())
        self._tasks.spawn(self._watch())

    async def close(self) -> None:
        """End the session: stop its engine work, cancel every task, release what it holds; idempotent."""
        if self._closing:
            return
        self._closing = True
        await self._stop_work()
        await self._tasks.cancel_all()
        self._inbox.clear()
        await self._release()
        self.closed.set()
        if self.on_closed is not None:
            self.on_closed()

    def channel_opened(self) -> None:
        """A control channel opened: the wait for the client's first message starts now. Over WebRTC
        the session exists before ICE, DTLS and SCTP let the client send, which on a loaded machine
        or a slow network can take seconds of `config_timeout`."""
        self._waiting_since = time.monotonic()

    def connection_changed(self) -> None:
        """Its connection was lost, or resumed (sessions/journal.py): the idle clock starts again, so
        that a session never idles out while its client cannot speak, nor as soon as it is back."""
        self._touch()

    def notify(self, message: str) -> None:
        """Tell the client something as an `error` event (e.g. that the server is going away)."""
        self._error(message)

    def _close_soon(self) -> None:
        """Close from inside one of the session's own tasks without cancelling it mid-way."""
        if self._closer is None:
            self._closer = asyncio.get_running_loop().create_task(self.close())

    # ----------------------------------------------------------------- what a transport sees

    @property
    def media_sink(self) -> MediaSink | None:
        """Where the peer's camera and microphone go; None for a session that takes no media."""
        return None

    @property
    def has_output(self) -> bool:
        """Whether the session's media output (speech, generated video) has somewhere to go."""
        return True

    def drop_output(self) -> bool:
        """Go on without the media output (the peer cannot receive it); False if the session cannot."""
        return False

    @abstractmethod
    def stats(self) -> dict[str, Any]: ...

    # ----------------------------------------------------------------- messages in

    def receive_text(self, raw: str) -> None:
        """Take one client message: refuse it at once, or queue it, typed, for the loop."""
        if self._closing or self._closer is not None or not self._reading():
            return
        self._touch()
        message = self._decode(raw)
        if isinstance(message, Refusal):
            self._refuse(message)
            return
        if not self._inbox.put_message(message, len(raw)):
            self._error(MESSAGE_QUEUE_FULL)
            return
        self._queued(message)

    def receive_binary(self, data: bytes) -> None:
        self._touch()
        self._refuse(self.binary_refusal)

    def receive_undecodable_text(self) -> None:
        """A text message that was not UTF-8, dropped by its DataChannel (patches/datachannel_receive.py);
        a WebSocket's is refused by aiohttp, which closes the socket (1007) as RFC 6455 requires."""
        self._touch()
        self._error(TEXT_NOT_UTF8)

    def event_dropped(self, size: int) -> None:
        self._error(event_too_large(size))

    def _queue_work(self, work: WorkItem) -> None:
        """Queue work for the loop, in order with the client's messages."""
        if not self._inbox.put_work(work):
            self._error(MESSAGE_QUEUE_FULL)

    def _touch(self) -> None:
        self._last_activity = time.monotonic()

    def _refuse(self, refusal: Refusal) -> None:
        if refusal.ends_reference_session:
            self._ends_reference_session(refusal.message)
        else:
            self._error(refusal.message)

    def _ends_reference_session(self, message: str) -> None:
        """An error the reference ends its session on; without `strict_reference` the session goes on."""
        self._error(message)
        if self.strict_reference:
            self._close_soon()

    async def _process_messages(self) -> None:
        """Handle the inbox one item at a time, in order, until a handler says the session is done."""
        while True:
            item = await self._inbox.get(self._wait_limit())
            if item is None:
                if not self._wait_limit() and self._wait_expired():  # not extended meanwhile
                    return
                continue
            name = item.name if isinstance(item, WorkItem) else item.type
            try:
                if isinstance(item, WorkItem):
                    await self._do(item)
                    continue
                done = await self._handle(item)
            except Exception:  # a bug must not take the session down
                logger.exception("session %s: handling %s failed", self.session_id, name)
                self._error(internal_error(name))
                continue
            if done:
                return

    async def _watch(self) -> None:
        """Check the protocol's clocks a few times per limit, until one of them ends the session."""
        while True:
            await asyncio.sleep(self._watch_period())
            if await self._check_clocks(time.monotonic()):
                return

    # ----------------------------------------------------------------- events out

    def _emit(self, event: ServerEvent) -> None:
        if self._closing:
            return
        message = event.error_message
        if message is not None:
            self.errors_sent += 1
            metrics.ERRORS.labels(self.kind, metrics.error_type(message)).inc()
        self.send(event.to_wire())

    # ----------------------------------------------------------------- engine work

    async def _abort_request(self, request_id: str) -> None:
        """Ask the engine to drop a request, bounded: a hung engine must not hang the session."""
        try:
            async with asyncio.timeout(ENGINE_CALL_TIMEOUT_S):
                await self.engine.abort(request_id)
        except Exception:
            logger.warning("session %s: abort of %s failed", self.session_id, request_id, exc_info=True)

    async def _cancel_task(self, task: asyncio.Task[Any]) -> None:
        """Cancel one of the session's tasks and give it CANCEL_WAIT_S to unwind."""
        task.cancel()
        await asyncio.wait([task], timeout=CANCEL_WAIT_S)

    # ----------------------------------------------------------------- the protocol's part

    @abstractmethod
    def _decode(self, raw: str) -> M | Refusal:
        """The protocol's codec, judged in the session's current state."""

    @abstractmethod
    async def _handle(self, message: M) -> bool:
        """Handle one client message; True when the session is done reading messages."""

    async def _do(self, work: WorkItem) -> None:
        """Do one work item the session queued for itself."""
        raise NotImplementedError(f"{type(self).__name__} queues no {work.name}")

    @abstractmethod
    def _error(self, message: str) -> None:
        """Send an `error` event in the protocol's shape."""

    def _reading(self) -> bool:
        """Whether client messages are still read (the reference stops reading after its last one)."""
        return True

    def _queued(self, message: M) -> None:
        """What a message changes as soon as it is queued (before the loop reaches it)."""

    def _wait_limit(self) -> float | None:
        """How long the loop may wait for the next item (e.g. for the first message); None: no limit."""
        return None

    def _first_message_wait(self) -> float:
        """What is left of `config_timeout` for the client's first message (see `channel_opened`)."""
        return max(0.0, self._waiting_since + self.settings.config_timeout - time.monotonic())

    def _wait_expired(self) -> bool:
        """The wait limit passed with nothing in the inbox; True ends the loop."""
        return False

    @abstractmethod
    def _watch_period(self) -> float: ...

    @abstractmethod
    async def _check_clocks(self, now: float) -> bool:
        """Act on the protocol's timeouts (idle, stall); True ends the watch."""

    async def _stop_work(self) -> None:
        """Closing, first: stop engine work while the session's tasks still run."""

    async def _release(self) -> None:
        """Closing, last: every task is gone; drop buffers, flush outputs, finish files."""
