"""Bearer credentials (RFC 6750) and the requests that need none.

CORS preflights (OPTIONS), /healthz and the browser page (/, /static/) stay open: a browser sends
no credentials on a preflight, a load balancer probes health without any, and the page itself asks
the user for the token before it signals. capabilities.py decides what a credential opens.
"""

from __future__ import annotations

from typing import Any

from aiohttp import web

OPEN_PATHS = frozenset({"/healthz", "/health", "/"})
OPEN_PREFIXES = ("/static/",)
# Set on a request that opens a realtime session with a valid ephemeral key (client_secrets.py):
# the key's session config. Such a request needs no server token.
GRANT = web.RequestKey("realtime_grant", dict[str, Any])
# Set once that request opened its session: only then is its ephemeral key used up.
KEY_SPENT = web.RequestKey("ephemeral_key_spent", bool)


def bearer_credentials(authorization: str) -> str | None:
    """The token of an `Authorization: Bearer <token>` header, or None.

    RFC 9110 section 11.1: the scheme is case-insensitive and one or more spaces follow it.
    """
    scheme, _, credentials = authorization.strip().partition(" ")
    if scheme.lower() != "bearer":
        return None
    return credentials.strip() or None
