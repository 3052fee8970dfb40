"""Who may do what: the server token opens everything, a session's own tokens open that session alone.

Creating a session returns, besides its id, two capabilities (docs/operations.md, "Who may act on a session"):
- the session token: control it (attach a controller, trickle candidates, end it) and all a view
  token allows;
- the view token: watch it (WHEP), read its stats, fetch its recording; never control or end it.
The server token (--auth-token) opens every session (operators), and with one configured it is
also what creates sessions. A token comes as `Authorization: Bearer <token>` or, for URLs that a
browser or a WHEP player opens as given, as the `access_token` query parameter (RFC 6750).

A token is an HMAC of the session id under a key drawn at startup, so there is nothing to store or
evict: a recording stays fetchable with its token after its session ended, and a token never
opens another session. A session route is declared with `requires`, so the check is made in one
place; every other route needs the server token, when there is one (`server_token_auth`).
"""

from __future__ import annotations

import base64
import functools
import hashlib
import hmac
import re
import secrets
from collections.abc import Awaitable, Callable, Iterable
from typing import Literal

from aiohttp import web
from aiohttp.typedefs import Handler, Middleware
from aiohttp.web_log import AccessLogger
from yarl import URL

from ..sessions.journal import Resumable
from .auth import GRANT, OPEN_PATHS, OPEN_PREFIXES, bearer_credentials
from .keys import SETTINGS

Scope = Literal["control", "view"]
TOKEN_PARAMETER = "access_token"  # RFC 6750 section 2.3
SESSION_TOKEN_HEADER = "Session-Token"
VIEW_TOKEN_HEADER = "View-Token"
SESSION_ID_HEADER = "Session-Id"
RESUME_TOKEN_HEADER = "Resume-Token"
GENERATION_HEADER = "Attachment-Generation"
LAST_EVENT_SEQ_HEADER = "Last-Event-Seq"  # a resume request's last_received_server_event_seq
ALLOW_RESYNC_HEADER = "Allow-Resync"  # a resume request's allow_resync ("true")
CHALLENGE = {"WWW-Authenticate": 'Bearer realm="rtc-omni"'}


class SessionTokens:
    """Mints and checks the tokens of every session of this server."""

    def __init__(self, key: bytes | None = None) -> None:
        self._key = key if key is not None else secrets.token_bytes(32)  # workers share their parent's

    def token(self, session_id: str, scope: Scope) -> str:
        digest = hmac.new(self._key, f"{scope}:{session_id}".encode(), hashlib.sha256).digest()
        return base64.urlsafe_b64encode(digest).rstrip(b"=").decode()

    def scope_of(self, session_id: str, token: str) -> Scope | None:
        """What `token` opens on the session: "control", "view", or nothing (None)."""
        given = token.encode()
        for scope in ("control", "view"):
            if hmac.compare_digest(given, self.token(session_id, scope).encode()):
                return scope
        return None


SESSION_TOKENS = web.AppKey("session_tokens", SessionTokens)


def presented_token(request: web.Request) -> str | None:
    """The token the request carries: its Bearer credentials, else its `access_token` parameter."""
    return bearer_credentials(request.headers.get("Authorization", "")) or request.query.get(TOKEN_PARAMETER) or None


def _is_server_token(request: web.Request, token: str | None) -> bool:
    server_token = request.app[SETTINGS].auth_token
    return server_token is not None and token is not None and hmac.compare_digest(token.encode(), server_token.encode())


def _error(status: int, message: str) -> web.Response:
    """A 401/403 that a WHIP/WHEP client on any origin can read: without the CORS headers a browser
    hides the status and the reason behind a network error (an allow-list, limits.py, narrows them)."""
    cors = {"Access-Control-Allow-Origin": "*", "Access-Control-Expose-Headers": "WWW-Authenticate"}
    return web.json_response({"error": message}, status=status, headers={**CHALLENGE, **cors})


def access_refusal(request: web.Request, scope: Scope | None, session_id: str | None = None) -> web.Response | None:
    """None when the request may act with `scope` on the session, else the 401 or 403 saying why.

    `scope` None: a request to the server as a whole (creating a session), which needs the server
    token when one is configured, or a redeemed ephemeral key (client_secrets.py)."""
    token = presented_token(request)
    if _is_server_token(request, token):
        return None
    if scope is None or session_id is None:
        if request.app[SETTINGS].auth_token is None or GRANT in request:
            return None
        return _error(401, "missing or wrong bearer token")
    if token is None:
        return _error(401, f"this needs the session's {'session' if scope == 'control' else 'view or session'} token")
    granted = request.app[SESSION_TOKENS].scope_of(session_id, token)
    if granted is None:  # RFC 6750: an invalid token is a 401, too little scope a 403
        return _error(401, "this token does not open this session (nor is it the server's token)")
    if scope == "control" and granted == "view":
        return _error(403, "a view token can watch this session, not control or end it")
    return None


_CHECKS_ITS_OWN_ACCESS: set[Callable[..., object]] = set()


def checks_its_own_access(handler: Handler) -> Handler:
    """Mark a handler that calls `access_refusal` itself (its session id is in its body), so that
    `server_token_auth` lets a caller holding only a session token reach it."""
    _CHECKS_ITS_OWN_ACCESS.add(handler)
    return handler


def requires(scope: Scope) -> Callable[[Callable[[web.Request], Awaitable[web.StreamResponse]]], Handler]:
    """A session route's handler, run only for a caller holding `scope` on the session its path
    names ({session_id}, or {call_id} on realtime calls), or the server token."""

    def decorate(handler: Callable[[web.Request], Awaitable[web.StreamResponse]]) -> Handler:
        @functools.wraps(handler)
        async def guarded(request: web.Request) -> web.StreamResponse:
            session_id = request.match_info.get("session_id") or request.match_info["call_id"]
            refused = access_refusal(request, scope, session_id)
            return refused if refused is not None else await handler(request)

        return checks_its_own_access(guarded)

    return decorate


def server_token_auth() -> Middleware:
    """With a server token: every request needs it, except the open paths (/healthz, the page,
    CORS preflights), a redeemed ephemeral key's, and the session routes, which check `requires`."""

    @web.middleware
    async def check_token(request: web.Request, handler: Handler) -> web.StreamResponse:
        open_path = request.path in OPEN_PATHS or request.path.startswith(OPEN_PREFIXES)
        if request.method == "OPTIONS" or open_path or request.match_info.handler in _CHECKS_ITS_OWN_ACCESS:
            return await handler(request)
        refused = access_refusal(request, None)
        return refused if refused is not None else await handler(request)

    return check_token


def with_token(url: URL, token: str) -> str:
    """`url` with `token` as its only query parameter (a Location a client uses as given)."""
    return str(url.with_query({TOKEN_PARAMETER: token}))


def session_credentials(request: web.Request, session_id: str) -> dict[str, str]:
    """A new session's capabilities, as the JSON fields of its creation's answer."""
    tokens = request.app[SESSION_TOKENS]
    return {"session_token": tokens.token(session_id, "control"), "view_token": tokens.token(session_id, "view")}


def credential_headers(request: web.Request, session_id: str) -> dict[str, str]:
    """The same, as the response headers of the endpoints that answer with SDP (WHIP, realtime calls)."""
    credentials = session_credentials(request, session_id)
    return {SESSION_TOKEN_HEADER: credentials["session_token"], VIEW_TOKEN_HEADER: credentials["view_token"]}


def resume_headers(session_id: str, resumable: Resumable | None) -> dict[str, str]:
    """What a client needs to resume the session, as response headers (none without resume)."""
    if resumable is None:
        return {}
    return {
        SESSION_ID_HEADER: session_id,
        RESUME_TOKEN_HEADER: resumable.token,
        GENERATION_HEADER: str(resumable.generation),
    }


class RedactingAccessLogger(AccessLogger):
    """aiohttp's access log, with the tokens in request lines and Referers masked: a token in a log
    is a token anyone reading the log holds."""

    _TOKEN = re.compile(rf"({TOKEN_PARAMETER}=)[^&\s\"]+")

    def _format_line(
        self, request: web.BaseRequest, response: web.StreamResponse, time: float
    ) -> Iterable[tuple[str | tuple[str, str], str]]:
        return [
            (key, self._TOKEN.sub(r"\1-", value) if isinstance(value, str) else value)
            for key, value in super()._format_line(request, response, time)
        ]
