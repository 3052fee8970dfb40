"""Qwen3-Omni MoE (thinker, talker, code2wav) on real vLLM-Omni 0.30 on CPU: one turn over a real
aiortc peer, one over the WebSocket endpoint (tests/vllm_cpu/serving.py), and a tool round trip
over the OpenAI Realtime API."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

import pytest

from .realtime_client import add_user_text, connect
from .vllm_cpu.serving import (
    MARKS,
    QWEN3_SHORT,
    Served,
    answers_with_text_and_audible_speech,
    printable_only,
    serve,
    timed,
    tiny_model,
    vllm_python,
    websocket_answers_with_text_and_speech,
)

# Only the schema makes the random model's call valid: vLLM's structured outputs on the thinker.
WEATHER = {
    "type": "function",
    "name": "get_weather",
    "description": "The weather in a city now.",
    "parameters": {
        "type": "object",
        "properties": {"city": {"type": "string", "enum": ["Paris", "Tokyo"]}},
        "required": ["city"],
        "additionalProperties": False,
    },
}

pytestmark = MARKS


@pytest.fixture(scope="module")
def qwen3() -> Iterator[Served]:
    yield from serve(vllm_python(), tiny_model("qwen3_omni_moe"))


@pytest.fixture(scope="module")
def short() -> dict[str, Any]:
    return printable_only(QWEN3_SHORT, tiny_model("qwen3_omni_moe"))


CLOCK = {
    "type": "function",
    "name": "get_time",
    "description": "The time now.",
    "parameters": {"type": "object", "properties": {}, "additionalProperties": False},
}


class TestQwen3OmniFullPipeline:
    """Qwen3-Omni MoE: thinker, talker (with its code predictor) and code2wav, one server."""

    async def test_answers_with_text_and_audible_speech(self, qwen3: Served, short: dict[str, Any]) -> None:
        await answers_with_text_and_audible_speech(qwen3, short, turns=1)

    async def test_the_same_model_over_the_websocket_endpoint(self, qwen3: Served, short: dict[str, Any]) -> None:
        await websocket_answers_with_text_and_speech(qwen3, short)

    async def test_a_named_tool_choice_calls_the_tool_with_schema_valid_arguments(self, qwen3: Served) -> None:
        choice = {"type": "function", "name": "get_weather"}
        async with connect(qwen3) as rt:
            await rt.send({"type": "session.update", "session": {"tools": [WEATHER], "tool_choice": choice}})
            await rt.until("session.updated")
            await add_user_text(rt, "What is the weather in Paris?")
            asked = time.monotonic()
            events = await rt.respond()
            timed("forced call (response.create to response.done)", asked)
            call = next((e for e in events if e["type"] == "response.function_call_arguments.done"), None)
            assert call is not None, (events, qwen3.tail())
            item = {"type": "function_call_output", "call_id": call["call_id"], "output": "22C and sunny"}
            await rt.send({"type": "conversation.item.create", "item": item})
            await rt.until("conversation.item.done")
            after = await rt.respond(output_modalities=["text"], tool_choice="none")
            # required: one of the tools, the model's pick, as one of `{"name", "arguments"}`
            required = await rt.respond(tools=[WEATHER, CLOCK], tool_choice="required")

        print(f"\n[vllm-cpu] call arguments {call['arguments']}")
        arguments = json.loads(call["arguments"])
        assert set(arguments) == {"city"} and arguments["city"] in ("Paris", "Tokyo"), arguments
        done = events[-1]["response"]
        assert done["status"] == "completed" and [i["type"] for i in done["output"]] == ["function_call"], done
        assert not [e for e in events if e["type"].startswith("response.output_audio")]  # a call is not spoken
        # The call and its result go back through the chat template: the answer is the model's.
        assert after[-1]["response"]["status"] == "completed", (after, qwen3.tail())
        picked = next((e for e in required if e["type"] == "response.output_item.done"), None)
        assert picked is not None and picked["item"]["type"] == "function_call", (required, qwen3.tail())
        print(f"[vllm-cpu] required: {picked['item']['name']} {picked['item']['arguments']}")
        if picked["item"]["name"] == "get_weather":
            assert json.loads(picked["item"]["arguments"])["city"] in ("Paris", "Tokyo")
        else:
            assert picked["item"]["name"] == "get_time" and json.loads(picked["item"]["arguments"]) == {}
