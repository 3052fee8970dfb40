"""One place that builds sessions, for every transport: the class for a kind, its engine, its output.

A transport (a WebRTC peer, a WHIP publisher, a vLLM-Omni WebSocket) says how it carries a
session's output to its client, as a `Carrier`: events through `send`, speech through a `Talker`
(or nowhere), generated video through a `VideoSink`. `create_session` picks the session class and
engine for the kind and hands it what it needs, so no transport branches on the session kind.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from aiohttp import web
from yarl import URL

from ..config import Settings
from ..engines import Engines
from ..protocol import generate_messages as generate_proto
from ..protocol import understand_messages as understand_proto
from ..sessions.generate import GenerateSession
from ..sessions.outputs import Talker, VideoSink
from ..sessions.realtime import RealtimeSession
from ..sessions.recordings import RecordingStore
from ..sessions.session import Session
from ..sessions.understand import UnderstandSession
from .capabilities import SESSION_TOKENS, SessionTokens, with_token
from .keys import ENGINES, RECORDINGS, SETTINGS

# What a client of a server that does not serve the kind is told (vLLM-Omni's own words).
NOT_AVAILABLE = {
    "understand": understand_proto.NOT_AVAILABLE,
    "generate": generate_proto.NOT_AVAILABLE,
    "realtime": understand_proto.NOT_AVAILABLE,
}

AnySession = Session[Any, Any]


class KindNotServed(Exception):
    """The server has no engine for this kind of session."""


class Carrier(Protocol):
    """How a transport carries one session's output to its client."""

    def send(self, event: dict[str, Any]) -> None:
        """An event, as a JSON-ready dict."""

    def talker(self) -> Talker | None:
        """Where an understanding session's speech goes (None: only as audio events, if asked for)."""

    def video(self) -> VideoSink:
        """Where a generation session's frames go."""


@dataclass(frozen=True)
class Services:
    """What every session is built from, whatever its transport: the app's shared state."""

    settings: Settings
    engines: Engines
    recordings: RecordingStore
    tokens: SessionTokens

    @classmethod
    def of(cls, app: web.Application) -> Services:
        return cls(app[SETTINGS], app[ENGINES], app[RECORDINGS], app[SESSION_TOKENS])

    def recording_url(self, session_id: str) -> str:
        """Where the session's recording is fetched: its path, with the session's view token."""
        path = URL(generate_proto.RECORDING_PATH.format(session_id=session_id))
        return with_token(path, self.tokens.token(session_id, "view"))


def create_session(
    kind: str,
    session_id: str,
    services: Services,
    carrier: Carrier,
    *,
    publisher: bool = False,
    strict_reference: bool = False,
    on_closed: Callable[[], None] | None = None,
    realtime_config: dict[str, Any] | None = None,
) -> AnySession:
    """A new, not yet started session of `kind`; KindNotServed without an engine for it.

    `publisher`: the client publishes media and never configures (WHIP), so an understanding
    session takes media at once with the default config. `realtime_config`: a realtime session's
    settings from before it starts (the model it was opened for, an ephemeral key's session, a
    WebRTC call's `session` part), validated by the caller."""
    engines = services.engines
    if kind == "realtime" and engines.understand is not None:
        return RealtimeSession(
            session_id=session_id,
            settings=services.settings,
            engine=engines.understand,
            send=carrier.send,
            talker=carrier.talker(),
            on_closed=on_closed,
            initial_config=realtime_config,
        )
    if kind == "understand" and engines.understand is not None:
        session = UnderstandSession(
            session_id=session_id,
            settings=services.settings,
            engine=engines.understand,
            send=carrier.send,
            talker=carrier.talker(),
            on_closed=on_closed,
            strict_reference=strict_reference,
        )
        if publisher:
            session.use_default_config()
        return session
    if kind == "generate" and engines.generate is not None:
        return GenerateSession(
            session_id=session_id,
            settings=services.settings,
            engine=engines.generate,
            send=carrier.send,
            video=carrier.video(),
            reserve_recording=services.recordings.reserve,
            recording_url=services.recording_url(session_id),
            on_closed=on_closed,
            strict_reference=strict_reference,
        )
    raise KindNotServed(NOT_AVAILABLE.get(kind, f"unknown session kind {kind!r}"))
