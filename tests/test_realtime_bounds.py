"""Bounded attacks on the realtime surface (issue 35): a client that stops reading, client strings
echoed in errors, conversation text, and session configs. Each one holds as a user would see it:
the client is disconnected with a reason, the error stays short, the oldest text is dropped, the
config keeps only OpenAI's fields, and the process grows less than a stated bound meanwhile.

The server runs in the test's process, so the growth counts the client's buffers too.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest

from rtc_omni.protocol import generate_messages, realtime_events, understand_messages
from rtc_omni.signaling.websocket import MAX_OUTBOX_BYTES, NOT_READING

from .conftest import RunningServer, WsFactory
from .realtime_client import connect
from .waiting import wait_until

MiB = 2**20
BIG_TEXT = "x" * (4 * MiB)  # one user item's text, as the attacks sent it
MAX_ERROR_BYTES = 1024  # an error event that names a client's megabyte
GROWTH_BOUND = 2 * MAX_OUTBOX_BYTES  # what any one attack below may add to the process, at its peak
RSS_SAMPLE_S = 0.02


def rss_bytes() -> int:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


class PeakGrowth:
    """The process's resident memory sampled while the block runs: its peak over where it began."""

    def __init__(self) -> None:
        self.start = self.peak = rss_bytes()

    async def _sample(self) -> None:
        while True:
            self.peak = max(self.peak, rss_bytes())
            await asyncio.sleep(RSS_SAMPLE_S)

    @property
    def growth(self) -> int:
        return self.peak - self.start

    @contextlib.asynccontextmanager
    async def watching(self) -> AsyncIterator[PeakGrowth]:
        sampler = asyncio.ensure_future(self._sample())
        try:
            yield self
        finally:
            sampler.cancel()
            self.peak = max(self.peak, rss_bytes())


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


# ----------------------------------------------------------------------------- a client that stops reading


async def test_a_client_that_stops_reading_is_disconnected_with_a_reason(server: RunningServer) -> None:
    retrieves = 48  # of a 4 MiB item: 192 MiB of events, three times the outbox's bound
    async with realtime_socket(server) as ws:
        async with PeakGrowth().watching() as memory:
            await ws.send_json(user_text(BIG_TEXT, id="big"))
            for _ in range(retrieves):
                await ws.send_json({"type": "conversation.item.retrieve", "item_id": "big"})
            await asyncio.sleep(3)  # reading nothing while the server answers
        retrieved = 0
        async with asyncio.timeout(20):
            while (message := await ws.receive()).type == aiohttp.WSMsgType.TEXT:
                retrieved += json.loads(message.data)["type"] == "conversation.item.retrieved"

    assert (message.type, message.data, message.extra) == (aiohttp.WSMsgType.CLOSE, 1008, NOT_READING)
    assert retrieved < retrieves
    assert memory.growth < GROWTH_BOUND, f"{memory.growth / MiB:.0f} MiB"
    await wait_until(lambda: len(server.registry) == 0)  # the session is gone with its socket


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


# ----------------------------------------------------------------------------- conversation text


async def test_conversation_text_counts_toward_the_byte_bound_and_the_oldest_items_go(server: RunningServer) -> None:
    items = 40  # of 4 MiB: 160 MiB of text, past the conversation's 64 MiB
    async with realtime_socket(server) as ws, PeakGrowth().watching() as memory:
        for n in range(items):
            await ws.send_json(user_text(BIG_TEXT, id=f"item_{n}"))
            await next_of(ws, "conversation.item.done")
        await ws.send_json({"type": "conversation.item.retrieve", "item_id": "item_0"})
        oldest = await next_of(ws, "error", "conversation.item.retrieved")
        await ws.send_json({"type": "conversation.item.retrieve", "item_id": f"item_{items - 1}"})
        newest = await next_of(ws, "error", "conversation.item.retrieved")

    assert oldest["type"] == "error" and oldest["error"]["code"] == "item_not_found"
    assert newest["type"] == "conversation.item.retrieved"
    assert memory.growth < GROWTH_BOUND, f"{memory.growth / MiB:.0f} MiB"


# ----------------------------------------------------------------------------- session config

AGENT_SESSION = {  # what an agent framework on the SDK's types sends: every field is OpenAI's
    "type": "realtime",
    "instructions": "Be brief.",
    "output_modalities": ["audio"],
    "max_output_tokens": "inf",
    "tool_choice": "auto",
    "tools": [
        {
            "type": "function",
            "name": "get_weather",
            "description": "The weather in a city.",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
        }
    ],
    "tracing": {"workflow_name": "support", "group_id": "g1"},
    "truncation": "auto",
    "include": ["item.input_audio_transcription.logprobs"],
    "audio": {
        "input": {"noise_reduction": {"type": "near_field"}, "turn_detection": None},
        "output": {"voice": "marin", "speed": 1.1},
    },
}


async def test_session_update_keeps_openais_fields_and_drops_unknown_keys(server: RunningServer) -> None:
    async with connect(server) as rt:
        await rt.send({"type": "session.update", "session": {**AGENT_SESSION, "modalities": ["text"], "foo": 1}})
        session = (await rt.until("session.updated"))[-1]["session"]

    for field, value in AGENT_SESSION.items():
        if field != "audio":
            assert session[field] == value, field
    assert session["audio"]["input"]["noise_reduction"] == {"type": "near_field", "strength": 1.0}  # OpenAI's default
    assert session["audio"]["output"]["voice"] == "marin" and session["audio"]["output"]["speed"] == 1.1
    assert "modalities" not in session and "foo" not in session  # the beta's name and a stranger: dropped


async def test_session_updates_of_unknown_keys_keep_nothing_and_echo_little(server: RunningServer) -> None:
    async with realtime_socket(server) as ws:
        for n in range(24):  # 24 MiB of unknown keys, at every level of the config
            junk = {f"junk_{n}": "x" * (MiB // 2)}
            await ws.send_json({"type": "session.update", "session": {**junk, "audio": {"input": junk}}})
            updated = await next_of(ws, "session.updated")
            assert len(json.dumps(updated)) < MAX_ERROR_BYTES * 2, n


async def test_passed_through_fields_are_bounded_in_bytes_and_the_session_goes_on(server: RunningServer) -> None:
    tools = [{"type": "function", "name": f"tool_{n}", "description": "x" * 3000} for n in range(100)]
    async with connect(server) as rt:
        await rt.send({"type": "session.update", "event_id": "evt_big", "session": {"tools": tools}})
        error = (await rt.until("error"))[-1]["error"]
        await rt.send({"type": "session.update", "session": {"tools": tools[:10]}})
        session = (await rt.until("session.updated"))[-1]["session"]

    assert (error["code"], error["param"], error["event_id"]) == ("invalid_value", "session", "evt_big")
    assert str(realtime_events.MAX_SESSION_PASS_THROUGH_BYTES) in error["message"]
    assert len(error["message"]) < MAX_ERROR_BYTES
    assert [(tool["name"], tool["description"]) for tool in session["tools"]] == [
        (tool["name"], tool["description"]) for tool in tools[:10]
    ]
