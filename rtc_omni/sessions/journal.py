"""What lets a session outlive its connection: the events it sent, numbered and kept, and the token
that lets one client take the session over on a new connection (docs/resume.md).

The contract is vLLM-Omni 0.30's `/v1/realtime` resume, so that one client library resumes against
both servers: every server event after `session.created` carries `server_event_seq` (1, 2, ...);
`session.created` carries `resume_token` and `attachment_generation`; a new connection presents the
token and the last seq it received, is answered `session.resumed` (a rotated token) and the events it
missed, in order, or `session.resync_required` when they are no longer kept. The old connection, if it
is still up, is told `session.replaced`.

The numbering is done at the transport edge (`stamp`), where the order on the wire is known, so a
replay sends the very bytes first sent. Nothing here knows a transport or a protocol.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import json
import logging
import secrets
import time
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from ..config import Settings

logger = logging.getLogger(__name__)

SEQ_FIELD = "server_event_seq"
CREATED = "session.created"
SNAPSHOTS = ("session.created", "session.updated")  # their `session` is what `session.resumed` reports
ENVELOPE_TYPES = ("session.event_ack", "session.heartbeat", "session.close")
MAX_ENVELOPE_CHARS = 1024

# The refusals' codes, as vLLM-Omni names them; each with the HTTP status a resume request gets.
INVALID_RESUME = "invalid_session_resume"
INVALID_RESUME_TOKEN = "invalid_resume_token"
RESUME_EXPIRED = "session_resume_expired"
JOURNAL_GAP = "journal_gap"
UNSUPPORTED_RESUME = "unsupported_session_resume"
RESUME_CONFLICT = "session_resume_conflict"
STATUS = {
    INVALID_RESUME: 400,
    INVALID_RESUME_TOKEN: 401,
    RESUME_EXPIRED: 404,
    JOURNAL_GAP: 409,
    UNSUPPORTED_RESUME: 409,
    RESUME_CONFLICT: 409,
}


class ResumeRefused(Exception):
    """A resume that cannot be granted; `code` is the client's to read, `status` the HTTP answer's."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.status = STATUS[code]


def dumps(event: dict[str, Any]) -> str:
    """An event as sent: compact JSON, ASCII (its length is its size in bytes)."""
    return json.dumps(event, separators=(",", ":"))


def envelope(raw: str) -> dict[str, Any] | None:
    """A resume envelope message (`session.event_ack`, `session.heartbeat`, `session.close`), which the
    transport answers itself, or None for anything else (the session's own message). Cheap for the
    large messages that are never envelopes."""
    if len(raw) > MAX_ENVELOPE_CHARS or '"session.' not in raw:
        return None
    try:
        message = json.loads(raw)
    except ValueError:
        return None
    if isinstance(message, dict) and message.get("type") in ENVELOPE_TYPES:
        return message
    return None


@dataclass
class _Entry:
    seq: int | None  # None: a binary message, sent right after the event before it
    at: float
    payload: str | bytes


class EventJournal:
    """The events sent, kept for a resume: bounded in bytes (the oldest dropped), and in age while a
    connection is attached (a connection that is lost is noticed within that age)."""

    def __init__(self, max_bytes: int, retain_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.max_bytes = max_bytes
        self.retain_s = retain_s
        self._clock = clock
        self._entries: deque[_Entry] = deque()
        self.bytes = 0
        self.head = 0  # the last seq given
        self.dropped_through = 0  # every seq up to this one is no longer kept

    def record(self, event: dict[str, Any]) -> str:
        """Number `event`, keep it, and return its text."""
        self.head += 1
        text = dumps({**event, SEQ_FIELD: self.head})
        self._keep(_Entry(self.head, self._clock(), text))
        return text

    def record_bytes(self, data: bytes) -> None:
        self._keep(_Entry(None, self._clock(), data))

    def _keep(self, entry: _Entry) -> None:
        self._entries.append(entry)
        self.bytes += len(entry.payload)
        while self.bytes > self.max_bytes and self._entries:
            self._drop_oldest()

    def _drop_oldest(self) -> None:
        entry = self._entries.popleft()
        self.bytes -= len(entry.payload)
        if entry.seq is not None:
            self.dropped_through = entry.seq
        while self._entries and self._entries[0].seq is None:  # a binary message goes with its event
            self._drop_oldest()

    def prune(self) -> None:
        """Drop what is older than `retain_s` (only while a connection is attached: a detached
        session's events wait for their client)."""
        oldest = self._clock() - self.retain_s
        while self._entries and self._entries[0].at < oldest:
            self._drop_oldest()

    def acknowledge(self, seq: int) -> None:
        """The client has everything up to `seq`: it need not be kept."""
        while self._entries and (self._entries[0].seq or self.dropped_through) <= seq:
            self._drop_oldest()

    def kept_after(self, seq: int) -> list[str | bytes] | None:
        """What was sent after `seq`, in order (a binary message with its event); None when some of
        it is no longer kept."""
        if seq < self.dropped_through or seq > self.head:
            return None
        missed: list[str | bytes] = []
        after = False
        for entry in self._entries:
            if entry.seq is not None:
                after = entry.seq > seq
            if after:
                missed.append(entry.payload)
        return missed


class ResumeCredential:
    """The session's resume token: only its digest is kept. Rotated on each resume; the last confirmed
    one stays good until a new connection is confirmed (a resume whose connection dropped before the
    client read its new token can be tried again with the token the client still holds)."""

    def __init__(self) -> None:
        self.generation = 0
        self.token = ""
        self._digest = b""
        self._previous: bytes | None = None
        self.rotate()
        self.confirm()

    def rotate(self) -> str:
        if self._previous is None:  # else the token given before is still the one last confirmed
            self._previous = self._digest
        self.token = secrets.token_urlsafe(32)
        self._digest = _digest(self.token)
        self.generation += 1
        return self.token

    def confirm(self) -> None:
        self._previous = None

    def matches(self, token: str) -> bool:
        given = _digest(token)
        return hmac.compare_digest(given, self._digest) or (
            self._previous is not None and hmac.compare_digest(given, self._previous)
        )


def _digest(token: str) -> bytes:
    return hashlib.sha256(token.encode()).digest()


def resumable_session(settings: Settings, session_id: str) -> Resumable | None:
    """The resume state of a new session, as the settings have it; None with --resume-grace 0."""
    if settings.resume_grace <= 0:
        return None
    return Resumable(session_id, settings.resume_grace, settings.resume_journal_bytes, settings.resume_journal_retain_s)


class Resumable:
    """One session's resume state: its journal, its credential, and the grace timer that ends it when
    no connection comes back. Made by the transport that carries the session (None without resume)."""

    def __init__(self, session_id: str, grace_s: float, max_bytes: int, retain_s: float) -> None:
        self.session_id = session_id
        self.grace_s = grace_s
        self.journal = EventJournal(max_bytes, retain_s)
        self.credential = ResumeCredential()
        self.attached = True
        self.resumes = 0
        self._snapshot: dict[str, Any] | None = None
        self._expiry: asyncio.Task[None] | None = None

    @property
    def token(self) -> str:
        return self.credential.token

    @property
    def generation(self) -> int:
        return self.credential.generation

    def stamp(self, event: dict[str, Any]) -> str:
        """The text of `event` as it goes out now: numbered and journaled, or for `session.created`
        given what a resume needs instead (the session's id, its token)."""
        if event.get("type") in SNAPSHOTS and isinstance(event.get("session"), dict):
            self._snapshot = event["session"]
        if event.get("type") == CREATED:
            credentials = {"session_id": self.session_id, "resume_token": self.token}
            return dumps({**event, **credentials, "attachment_generation": self.generation})
        if self.attached:
            self.journal.prune()
        return self.journal.record(event)

    def record_bytes(self, data: bytes) -> None:
        self.journal.record_bytes(data)

    def resume(
        self, token: str, last_seq: int, allow_resync: bool = False, max_bytes: int | None = None
    ) -> list[str | bytes]:
        """Grant a resume: rotate the token and return what the new connection gets first, in order
        (`session.resync_required` if events it missed are gone and it allows that, `session.resumed`,
        then the events after `last_seq`). `max_bytes`: what the connection takes at once; more
        missed than that counts as a gap. Raises ResumeRefused."""
        if not self.credential.matches(token):
            raise ResumeRefused(INVALID_RESUME_TOKEN, "the resume token is wrong, or was rotated by a later resume")
        missed = self.journal.kept_after(last_seq)
        if missed is not None and max_bytes is not None and sum(len(m) for m in missed) > max_bytes:
            missed = None
        first: list[str | bytes] = []
        if missed is None:
            if not allow_resync:
                raise ResumeRefused(
                    JOURNAL_GAP,
                    f"events after {last_seq} are no longer kept (kept: {self.journal.dropped_through + 1}.."
                    f"{self.journal.head}); resume with allow_resync to continue without them",
                )
            first.append(
                dumps({"type": "session.resync_required", "session_id": self.session_id, "reason": JOURNAL_GAP})
            )
            missed = []
        self.credential.rotate()
        self.resumes += 1
        resumed: dict[str, Any] = {
            "type": "session.resumed",
            "session_id": self.session_id,
            "attachment_generation": self.generation,
            "resume_token": self.token,
        }
        if self._snapshot is not None:
            resumed["session"] = self._snapshot
        logger.info(
            "session %s: resumed (generation %d, %d events again)", self.session_id, self.generation, len(missed)
        )
        return [*first, dumps(resumed), *missed]

    def confirm(self) -> None:
        """The resumed connection is up: the token it replaced is no longer good."""
        self.credential.confirm()

    def replaced_event(self) -> str:
        """What a connection that another resumed the session from is told before it is closed."""
        return dumps(
            {"type": "session.replaced", "session_id": self.session_id, "attachment_generation": self.generation}
        )

    def answer_envelope(self, message: dict[str, Any]) -> str | None:
        """The reply to an envelope message (`envelope`): None for an ack; `session.close` is answered
        `session.closed`, and the transport then ends the session."""
        kind = message.get("type")
        if kind == "session.event_ack":
            seq = message.get(SEQ_FIELD)
            if isinstance(seq, int) and not isinstance(seq, bool) and 0 <= seq <= self.journal.head:
                self.journal.acknowledge(seq)
                return None
            return dumps(
                {
                    "type": "error",
                    "error": {
                        "type": "invalid_request_error",
                        "code": "invalid_event_ack",
                        "message": f"{SEQ_FIELD} must be an integer from 0 to {self.journal.head}",
                    },
                }
            )
        if kind == "session.heartbeat":
            return dumps({"type": "session.heartbeat_ack", "session_id": self.session_id, SEQ_FIELD: self.journal.head})
        return dumps({"type": "session.closed", "session_id": self.session_id, "reason": "client_close"})

    def detach(self, expire: Callable[[], Awaitable[None]]) -> None:
        """The connection is lost: keep every event, and end the session (`expire`) after the grace."""
        if not self.attached:
            return
        self.attached = False
        self._expiry = asyncio.get_running_loop().create_task(self._expire(expire))
        logger.info("session %s: connection lost; resumable for %.1f s", self.session_id, self.grace_s)

    async def _expire(self, expire: Callable[[], Awaitable[None]]) -> None:
        await asyncio.sleep(self.grace_s)
        logger.info("session %s: not resumed within %.1f s, ending it", self.session_id, self.grace_s)
        await expire()

    def attach(self) -> None:
        self.attached = True
        if self._expiry is not None and self._expiry is not asyncio.current_task():
            self._expiry.cancel()
        self._expiry = None

    def close(self) -> None:
        if self._expiry is not None and self._expiry is not asyncio.current_task():
            self._expiry.cancel()
        self._expiry = None

    def stats(self) -> dict[str, Any]:
        return {"attached": self.attached, "resumes": self.resumes, "journal_bytes": self.journal.bytes}
