"""Bearer-token authentication (RFC 6750) for every HTTP request, as WHIP requires.

One middleware, so no handler can forget it. CORS preflights (OPTIONS), /healthz and the browser
page (/, /static/) stay open: a browser sends no credentials on a preflight, a load balancer probes
health without any, and the page itself asks the user for the token before it signals.
"""

from __future__ import annotations

import hmac

from aiohttp import web
from aiohttp.typedefs import Handler, Middleware

from .client_secrets import GRANT

OPEN_PATHS = frozenset({"/healthz", "/health", "/"})
OPEN_PREFIXES = ("/static/",)


def bearer_auth(token: str) -> Middleware:
    """A middleware answering 401 unless `Authorization: Bearer <token>` is sent."""
    expected = f"Bearer {token}".encode()

    @web.middleware
    async def check_token(request: web.Request, handler: Handler) -> web.StreamResponse:
        if request.method == "OPTIONS" or request.path in OPEN_PATHS or request.path.startswith(OPEN_PREFIXES):
            return await handler(request)
        if GRANT in request:  # a realtime session opened with a valid ephemeral key (client_secrets.py)
            return await handler(request)
        given = request.headers.get("Authorization", "").encode()
        if not hmac.compare_digest(given, expected):
            return web.json_response(
                {"error": "missing or wrong bearer token"},
                status=401,
                headers={"WWW-Authenticate": 'Bearer realm="rtc-omni"'},
            )
        return await handler(request)

    return check_token
