"""A scripted upstream: a WebSocket server on 127.0.0.1 that answers as a test says a vLLM-Omni
server (or a hostile one) would."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

from aiohttp import web
from aiohttp.test_utils import TestServer


@asynccontextmanager
async def scripted_upstream(path: str, reply: Callable[[dict[str, Any]], list[Any]]) -> AsyncIterator[str]:
    """A WebSocket server at `path` that answers each client message with `reply`'s messages (JSON
    values, or text sent as it is); yields its ws:// address."""

    async def handler(request: web.Request) -> web.WebSocketResponse:
        ws = web.WebSocketResponse()
        await ws.prepare(request)
        async for message in ws:
            for out in reply(json.loads(message.data)):
                await (ws.send_str(out) if isinstance(out, str) else ws.send_json(out))
        return ws

    app = web.Application()
    app.router.add_get(path, handler)
    server = TestServer(app, host="127.0.0.1", port=0)
    await server.start_server()
    try:
        yield str(server.make_url("")).rstrip("/").replace("http://", "ws://")
    finally:
        await server.close()
