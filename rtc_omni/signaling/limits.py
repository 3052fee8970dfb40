"""HTTP guards: a per-client rate limit on session creation, and a CORS allow-list.

Both are aiohttp middlewares, so no handler can forget them; the token check is in auth.py.
"""

from __future__ import annotations

import math
import time
from collections import OrderedDict

from aiohttp import web
from aiohttp.typedefs import Handler, Middleware

SESSION_CREATING_PATHS = ("/v1/rtc/offer", "/whip", "/whep")
MAX_TRACKED_CLIENTS = 10_000


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
        if request.method == "POST" and request.path.startswith(SESSION_CREATING_PATHS):
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
            response.headers.setdefault("Access-Control-Allow-Headers", "Authorization, Content-Type, If-Match")
            response.headers.setdefault("Access-Control-Max-Age", "600")
        else:
            response = await handler(request)
        response.headers.pop("Access-Control-Allow-Origin", None)
        if allowed and origin is not None:
            response.headers["Access-Control-Allow-Origin"] = origin
            response.headers["Vary"] = "Origin"
        return response

    return cors
