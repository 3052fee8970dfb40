"""Bounded attacks on the realtime surface (issue 35): client strings echoed in errors. Each one
holds as a user would see it: the error stays short, and the session goes on.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest

from rtc_omni.protocol import generate_messages, realtime_events, understand_messages

from .conftest import RunningServer, WsFactory

MiB = 2**20
MAX_ERROR_BYTES = 1024  # an error event that names a client's megabyte


@contextlib.asynccontextmanager
async def realtime_socket(server: RunningServer) -> AsyncIterator[aiohttp.ClientWebSocketResponse]:
    """A plain WebSocket on `/v1/realtime` (no SDK: nothing kept of what it receives), past session.created."""
    async with aiohttp.ClientSession() as http:
        url = server.url.replace("http://", "ws://") + realtime_events.WEBSOCKET_PATH
        async with http.ws_connect(url, max_msg_size=0) as ws:
            assert (await ws.receive_json())["type"] == "session.created"
            yield ws


async def next_of(ws: aiohttp.ClientWebSocketResponse, *types: str) -> dict[str, Any]:
    async with asyncio.timeout(20):
        while (event := await ws.receive_json())["type"] not in types:
            pass
    return event  # type: ignore[no-any-return]


def user_text(text: str, **item: Any) -> dict[str, Any]:
    content = [{"type": "input_text", "text": text}]
    return {"type": "conversation.item.create", "item": {"type": "message", "role": "user", "content": content, **item}}


# ----------------------------------------------------------------------------- client strings in errors

HUGE = "x" * MiB
ECHOED = [
    pytest.param({"type": "conversation.item.retrieve", "item_id": HUGE}, id="retrieve-item_id"),
    pytest.param({"type": "conversation.item.delete", "item_id": HUGE}, id="delete-item_id"),
    pytest.param(
        {"type": "conversation.item.truncate", "item_id": HUGE, "content_index": 0, "audio_end_ms": 0},
        id="truncate-item_id",
    ),
    pytest.param({"type": HUGE}, id="event-type"),
    pytest.param({**user_text("hi"), "previous_item_id": HUGE}, id="previous_item_id"),
    pytest.param({**user_text("hi", **{HUGE: 1})}, id="unknown-item-key"),
    pytest.param({"type": "session.update", "event_id": HUGE, "session": {}}, id="event_id"),
]


@pytest.mark.parametrize("event", ECHOED)
async def test_a_realtime_error_names_a_clients_megabyte_in_a_few_characters(
    server: RunningServer, event: dict[str, Any]
) -> None:
    async with realtime_socket(server) as ws:
        await ws.send_json(event)
        error = await next_of(ws, "error")
        await ws.send_json({"type": "conversation.item.retrieve", "item_id": "nope"})
        later = await next_of(ws, "error")  # the session goes on

    assert len(json.dumps(error)) < MAX_ERROR_BYTES, error["error"]["message"][:200]
    assert later["error"]["code"] == "item_not_found"


@pytest.mark.parametrize(
    "path", [understand_messages.WEBSOCKET_PATH, generate_messages.WEBSOCKET_PATH], ids=["understand", "generate"]
)
async def test_a_vllm_omni_error_names_a_clients_megabyte_in_a_few_characters(
    server: RunningServer, make_ws: WsFactory, path: str
) -> None:
    client = await make_ws(server, path)
    await client.send({"type": HUGE})
    error = await client.wait_event("error")

    assert len(json.dumps(error)) < MAX_ERROR_BYTES, error["message"][:200]
    assert error["message"].endswith("xxx...")
