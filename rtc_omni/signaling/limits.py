"""HTTP guards: a per-client rate limit on opening sessions (every handler marked `opens_session`),
request bodies read within a deadline and in a known charset, a CORS allow-list, and a cap on
connections per client address.

The first three are aiohttp middlewares, so no handler can forget them (the token check is in
auth.py). The connection cap sits below HTTP, where a client that never finishes its headers is
seen; aiohttp's keep-alive timeout (`handler_args`, app.py) closes such connections.
"""

from __future__ import annotations

import asyncio
import codecs
import json
import logging
import math
import time
from collections import Counter, OrderedDict
from collections.abc import Callable
from typing import Any, cast

from aiohttp import web
from aiohttp.typedefs import Handler, Middleware

from .capabilities import (
    ALLOW_RESYNC_HEADER,
    GENERATION_HEADER,
    LAST_EVENT_SEQ_HEADER,
    RESUME_TOKEN_HEADER,
    SESSION_TOKEN_HEADER,
    VIEW_TOKEN_HEADER,
)

logger = logging.getLogger(__name__)

MAX_TRACKED_CLIENTS = 10_000
RESUME_HEADERS = f"{RESUME_TOKEN_HEADER}, {LAST_EVENT_SEQ_HEADER}, {ALLOW_RESYNC_HEADER}"
ALLOWED_HEADERS = f"Authorization, Content-Type, If-Match, {RESUME_HEADERS}"
# What a page reads from an answer: the call's URL (OpenAI's clients take the call id from it) and its tokens.
EXPOSED_HEADERS = f"Location, {SESSION_TOKEN_HEADER}, {VIEW_TOKEN_HEADER}, {RESUME_TOKEN_HEADER}, {GENERATION_HEADER}"
_OPENS_SESSION: set[Callable[..., object]] = set()


def opens_session(handler: Handler) -> Handler:
    """Mark a route handler that opens a session or a peer (an offer, a WebSocket upgrade), so that
    `session_rate_limit` counts it; the mark is on the handler, so no path list can miss a route."""
    _OPENS_SESSION.add(handler)
    return handler


class TokenBucket:
    """`per_minute` requests per minute per key, with bursts of up to `per_minute`."""

    def __init__(self, per_minute: int) -> None:
        self.capacity = float(per_minute)
        self.rate = per_minute / 60.0
        self._buckets: OrderedDict[str, tuple[float, float]] = OrderedDict()  # key -> (tokens, at)

    def take(self, key: str, now: float | None = None) -> float:
        """0 when allowed; otherwise the seconds until a request would be."""
        now = time.monotonic() if now is None else now
        tokens, at = self._buckets.pop(key, (self.capacity, now))
        tokens = min(self.capacity, tokens + (now - at) * self.rate)
        wait = 0.0 if tokens >= 1.0 else (1.0 - tokens) / self.rate
        self._buckets[key] = (tokens - 1.0 if wait == 0.0 else tokens, now)
        while len(self._buckets) > MAX_TRACKED_CLIENTS:  # bounded: forget the least recent client
            self._buckets.popitem(last=False)
        return wait


def session_rate_limit(per_minute: int) -> Middleware:
    """429 + Retry-After when one client address creates sessions faster than `per_minute`."""
    bucket = TokenBucket(per_minute)

    @web.middleware
    async def limit(request: web.Request, handler: Handler) -> web.StreamResponse:
        if request.match_info.handler in _OPENS_SESSION:
            wait = bucket.take(request.remote or "unknown")
            if wait > 0:
                return web.json_response(
                    {"error": f"too many new sessions from this client; retry in {math.ceil(wait)} s"},
                    status=429,
                    headers={"Retry-After": str(math.ceil(wait))},
                )
        return await handler(request)

    return limit


def cors_allow_list(origins: list[str]) -> Middleware:
    """Let browsers on the listed origins call the API ('*' allows any); others get no CORS grant."""
    allow_any = "*" in origins

    @web.middleware
    async def cors(request: web.Request, handler: Handler) -> web.StreamResponse:
        origin = request.headers.get("Origin")
        allowed = origin is not None and (allow_any or origin in origins)
        if request.method == "OPTIONS" and origin is not None and "Access-Control-Request-Method" in request.headers:
            if not allowed:
                return web.json_response({"error": f"origin {origin} is not allowed"}, status=403)
            try:
                response = await handler(request)
            except web.HTTPMethodNotAllowed:
                response = web.Response(status=204)
            response.headers.setdefault("Access-Control-Allow-Methods", "GET, POST, PATCH, DELETE, OPTIONS")
            # The headers the page asks to send: its SDK may add its own (the OpenAI Agents SDK sends
            # X-OpenAI-Agents-SDK), and the origin is already trusted.
            requested = request.headers.get("Access-Control-Request-Headers")
            response.headers.setdefault("Access-Control-Allow-Headers", requested or ALLOWED_HEADERS)
            response.headers.setdefault("Access-Control-Max-Age", "600")
        else:
            response = await handler(request)
        response.headers.pop("Access-Control-Allow-Origin", None)
        if allowed and origin is not None:
            response.headers["Access-Control-Allow-Origin"] = origin
            response.headers["Vary"] = "Origin"
            response.headers.setdefault("Access-Control-Expose-Headers", EXPOSED_HEADERS)
        return response

    return cors


def text_body(deadline_s: float) -> Middleware:
    """Every request body is read within `deadline_s` (408 otherwise: a client dribbling it) and must be
    text in a known charset (415) that decodes (400). Every endpoint takes text (JSON, SDP, SDP
    fragments), so handlers' `.text()` and `.json()` then read the kept body and cannot fail."""

    @web.middleware
    async def read_text_body(request: web.Request, handler: Handler) -> web.StreamResponse:
        if not request.can_read_body:
            return await handler(request)
        try:
            async with asyncio.timeout(deadline_s):
                body = await request.read()  # kept by aiohttp for the handler
        except TimeoutError:
            return _refusal(408, f"request body not received within {deadline_s:g} s", Connection="close")
        charset = request.charset or "utf-8"
        try:
            codecs.lookup(charset)
        except LookupError:
            return _refusal(415, f"unknown charset {charset!r}; send UTF-8")
        try:
            body.decode(charset)
        except UnicodeDecodeError as exc:
            return _refusal(400, f"body is not valid {charset}: {exc.reason} at byte {exc.start}")
        return await handler(request)

    return read_text_body


def _refusal(status: int, message: str, **headers: str) -> web.Response:
    """An error that WHIP players and browsers on other origins can read (WHIP allows any origin)."""
    return web.json_response({"error": message}, status=status, headers={"Access-Control-Allow-Origin": "*", **headers})


class ConnectionLimit:
    """A protocol factory that lets at most `per_client` connections be open from one address;
    the next gets a 503 and is closed. `factory` makes the real protocol (aiohttp's RequestHandler)."""

    def __init__(self, factory: Callable[[], asyncio.Protocol], per_client: int) -> None:
        self.factory = factory
        self.per_client = per_client
        self.open: Counter[str] = Counter()

    def __call__(self) -> asyncio.Protocol:
        return _CountedConnection(self)


_REFUSAL_BODY = json.dumps({"error": "too many connections from this client address"}).encode()
REFUSAL = (
    b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\nRetry-After: 5\r\n"
    b"Connection: close\r\nContent-Length: " + str(len(_REFUSAL_BODY)).encode() + b"\r\n\r\n" + _REFUSAL_BODY
)


class _CountedConnection(asyncio.Protocol):
    """One connection: counted against its address, or refused; everything else goes to the real protocol."""

    def __init__(self, limit: ConnectionLimit) -> None:
        self._limit = limit
        self._inner: asyncio.Protocol | None = None
        self._address = ""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        peer: Any = transport.get_extra_info("peername")
        self._address = str(peer[0]) if isinstance(peer, tuple) else str(peer)
        if self._limit.open[self._address] >= self._limit.per_client:
            logger.warning("refusing a connection: %s already has %d open", self._address, self._limit.per_client)
            # a stream transport, though uvloop's is no subclass of asyncio.Transport
            cast(asyncio.WriteTransport, transport).write(REFUSAL)
            transport.close()
            return
        self._limit.open[self._address] += 1
        self._inner = self._limit.factory()
        self._inner.connection_made(transport)

    def connection_lost(self, exc: Exception | None) -> None:
        if self._inner is None:
            return
        self._limit.open[self._address] -= 1
        if self._limit.open[self._address] <= 0:
            del self._limit.open[self._address]
        self._inner.connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if self._inner is not None:
            self._inner.data_received(data)

    def eof_received(self) -> bool | None:
        return self._inner.eof_received() if self._inner is not None else None

    def pause_writing(self) -> None:
        if self._inner is not None:
            self._inner.pause_writing()

    def resume_writing(self) -> None:
        if self._inner is not None:
            self._inner.resume_writing()
