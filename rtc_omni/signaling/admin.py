"""Operators' endpoints: `POST /v1/admin/drain` drains the server (drain.py), as SIGUSR2 does.

It needs the server token (--auth-token, checked by capabilities.server_token_auth); a server without
one has no admin endpoint to open (403): send it SIGUSR2 instead.
"""

from __future__ import annotations

from aiohttp import web

from .keys import DRAIN, REGISTRY, SETTINGS
from .offer import json_error

DRAIN_PATH = "/v1/admin/drain"


async def post_drain(request: web.Request) -> web.Response:
    if request.app[SETTINGS].auth_token is None:
        return json_error(403, "the admin endpoints need --auth-token; without one, send the server SIGUSR2")
    request.app[DRAIN].request()
    return web.json_response({"status": "draining", "sessions": request.app[REGISTRY].open_in_server()}, status=202)


def add_routes(app: web.Application) -> None:
    app.router.add_post(DRAIN_PATH, post_drain)
