"""Bearer-token authentication (RFC 6750) for every HTTP request, as WHIP requires.

One middleware, so no handler can forget it. CORS preflights (OPTIONS), /healthz and the browser
page (/, /static/) stay open: a browser sends no credentials on a preflight, a load balancer probes
health without any, and the page itself asks the user for the token before it signals.
"""

from __future__ import annotations

import hmac
from typing import Any

from aiohttp import web
from aiohttp.typedefs import Handler, Middleware

OPEN_PATHS = frozenset({"/healthz", "/health", "/"})
OPEN_PREFIXES = ("/static/",)
# Set on a request that opens a realtime session with a valid ephemeral key (client_secrets.py):
# the key's session config. Such a request needs no server token.
GRANT = web.RequestKey("realtime_grant", dict[str, Any])


def bearer_credentials(authorization: str) -> str | None:
    """The token of an `Authorization: Bearer <token>` header, or None.

    RFC 9110 section 11.1: the scheme is case-insensitive and one or more spaces follow it.
    """
    scheme, _, credentials = authorization.strip().partition(" ")
    if scheme.lower() != "bearer":
        return None
    return credentials.strip() or None


def bearer_auth(token: str) -> Middleware:
    """A middleware answering 401 unless `Authorization: Bearer <token>` is sent."""
    expected = token.encode()

    @web.middleware
    async def check_token(request: web.Request, handler: Handler) -> web.StreamResponse:
        if request.method == "OPTIONS" or request.path in OPEN_PATHS or request.path.startswith(OPEN_PREFIXES):
            return await handler(request)
        if GRANT in request:
            return await handler(request)
        given = bearer_credentials(request.headers.get("Authorization", "")) or ""
        if not hmac.compare_digest(given.encode(), expected):
            return web.json_response(
                {"error": "missing or wrong bearer token"},
                status=401,
                headers={"WWW-Authenticate": 'Bearer realm="rtc-omni"'},
            )
        return await handler(request)

    return check_token
