"""The realtime session on an in-memory transport: whatever a client sends, every event it gets
back is one the official SDK types, and no handler fails (no "Internal error" ever reaches it)."""

from __future__ import annotations

import asyncio
import json
from typing import Any

from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st
from openai.types.realtime import RealtimeServerEvent
from pydantic import TypeAdapter

from rtc_omni.config import Settings
from rtc_omni.engines import SyntheticEngine
from rtc_omni.sessions.realtime import RealtimeSession

from .conftest import FAST_SETTINGS

SERVER_EVENT: TypeAdapter[Any] = TypeAdapter(RealtimeServerEvent)
TYPES = [
    "session.update",
    "input_audio_buffer.append",
    "input_audio_buffer.commit",
    "input_audio_buffer.clear",
    "conversation.item.create",
    "conversation.item.retrieve",
    "conversation.item.delete",
    "conversation.item.truncate",
    "response.create",
    "response.cancel",
    "output_audio_buffer.clear",
    "no.such.event",
]
scalars = st.one_of(st.none(), st.booleans(), st.integers(-5, 100_000), st.text(max_size=12))
values = st.recursive(
    scalars,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3),
    max_leaves=6,
)
content_part = st.fixed_dictionaries(
    {"type": st.sampled_from(["input_text", "input_audio", "input_image", "output_text", "output_audio", "x"])},
    optional={
        "text": st.text(max_size=20),
        "audio": st.sampled_from(["AAAA", "%%", "", "AAE="]),
        "image_url": st.sampled_from(["data:image/png;base64,AAAA", "http://x", ""]),
        "transcript": st.text(max_size=10),
    },
)
item = st.fixed_dictionaries(
    {"type": st.sampled_from(["message", "function_call"]), "role": st.sampled_from(["user", "assistant", "system"])},
    optional={"content": st.lists(content_part, max_size=3), "id": st.sampled_from(["a", "b", "x" * 70])},
)
fields = st.fixed_dictionaries(
    {},
    optional={
        "event_id": st.sampled_from(["e1", "e2"]),
        "session": st.one_of(
            values,
            st.fixed_dictionaries(
                {},
                optional={
                    "instructions": st.text(max_size=10),
                    "output_modalities": st.sampled_from([["text"], ["audio"], ["text", "audio"], []]),
                    "audio": st.sampled_from(
                        [{"input": {"turn_detection": {"type": "server_vad"}}}, {"input": {"turn_detection": None}}]
                    ),
                },
            ),
        ),
        "audio": st.sampled_from(["AAAA" * 100, "AAE=", "%%", ""]),
        "item": st.one_of(values, item),
        "item_id": st.sampled_from(["a", "b", "nope"]),
        "previous_item_id": st.sampled_from(["a", "root", "nope"]),
        "content_index": st.integers(-1, 2),
        "audio_end_ms": st.integers(-1, 5000),
        "response": st.one_of(values, st.just({"output_modalities": ["text"]})),
        "response_id": st.text(max_size=5),
    },
)
events = st.builds(lambda t, f: {"type": t, **f}, st.sampled_from(TYPES), fields)


@settings(max_examples=30, deadline=None, phases=[Phase.generate], suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.one_of(events.map(json.dumps), st.sampled_from(["{", "[]", "1", '{"type": 5}'])), max_size=12))
def test_any_client_events_get_sdk_typed_events_and_no_handler_fails(raws: list[str]) -> None:
    async def run() -> list[dict[str, Any]]:
        sent: list[dict[str, Any]] = []
        engine = SyntheticEngine(ttft=0.0, token_rate=2000.0, audio_speed=100.0, voice="tone")
        session = RealtimeSession(
            session_id="fuzz", settings=Settings(**FAST_SETTINGS), engine=engine, send=sent.append
        )
        session.start()
        for raw in raws:
            session.receive_text(raw)
        await asyncio.sleep(0.3)  # the loop works through the inbox; responses stream meanwhile
        await session.close()
        return sent

    sent = asyncio.run(run())
    for event in sent:
        SERVER_EVENT.validate_python(event)
        if event["type"] == "error":
            assert not event["error"]["message"].startswith("Internal error"), event
