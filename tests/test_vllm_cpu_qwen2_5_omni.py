"""Qwen2.5-Omni (thinker, talker, code2wav) on real vLLM-Omni 0.30 on CPU: `rtc-omni serve --engine
vllm --model DIR` on the tiny model, real aiortc peers and the WebSocket endpoint (tests/vllm_cpu/serving.py)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import aiohttp
import pytest

from .vllm_cpu.serving import (
    LONG,
    MARKS,
    SHORT,
    TURN_TIMEOUT_S,
    Served,
    answers_with_text_and_audible_speech,
    printable_only,
    serve,
    tiny_model,
    understand_client,
    vllm_python,
    websocket_answers_with_text_and_speech,
)

pytestmark = MARKS


@pytest.fixture(scope="module")
def qwen25() -> Iterator[Served]:
    yield from serve(vllm_python(), tiny_model("qwen2_5_omni"))


@pytest.fixture(scope="module")
def configs() -> dict[str, dict[str, Any]]:
    model = tiny_model("qwen2_5_omni")
    return {"short": printable_only(SHORT, model), "long": printable_only(LONG, model)}


class TestQwen25OmniFullPipeline:
    """Thinker, talker and code2wav, one server for the class."""

    async def test_answers_with_text_and_audible_speech(self, qwen25: Served, configs: dict[str, Any]) -> None:
        await answers_with_text_and_audible_speech(qwen25, configs["short"], turns=2)

    async def test_the_same_model_over_the_websocket_endpoint(self, qwen25: Served, configs: dict[str, Any]) -> None:
        await websocket_answers_with_text_and_speech(qwen25, configs["short"])

    async def test_an_interrupt_aborts_and_the_next_turn_works(self, qwen25: Served, configs: dict[str, Any]) -> None:
        client = await understand_client(qwen25, configs["long"])
        try:
            mark = len(client.events)
            client.send({"type": "video.query", "text": "Tell me a long story."})
            start = await client.wait_event("response.start", after=mark, timeout=TURN_TIMEOUT_S)
            await client.wait_event("response.text.delta", after=mark, timeout=TURN_TIMEOUT_S)
            second = asyncio.ensure_future(client.ask("Stop. What colour?", timeout=TURN_TIMEOUT_S))
            cancelled = await client.wait_event("response.cancelled", after=mark, timeout=30)
            assert cancelled["request_id"] == start["request_id"]
            # vLLM-Omni says it aborted the request (its id carries a suffix of vLLM-Omni's own).
            aborted = f"Aborted request(s) ['{start['request_id']}"
            async with asyncio.timeout(30):
                while aborted not in qwen25.tail(2000):
                    await asyncio.sleep(0.2)
            result = await second
        finally:
            await client.close()
        assert not result.errors and not result.cancelled and result.text, (result.errors, qwen25.tail())
        assert result.events[-1]["type"] == "response.audio.done"

    async def test_a_talker_killed_by_its_parameters_makes_health_fail_and_turns_say_why(self, qwen25: Served) -> None:
        # Last in the class: it kills the server's talker stage for good. Without a repetition
        # penalty vLLM drops the prompt token ids the Qwen2.5-Omni talker needs (docs/vllm.md).
        fatal = {"sampling_params_list": [{"max_tokens": 4}, {"max_tokens": 8, "repetition_penalty": 1.0}]}
        client = await understand_client(qwen25, fatal)
        try:
            first = await client.ask("Hello?", timeout=TURN_TIMEOUT_S)
            second = await client.ask("Anyone?", timeout=TURN_TIMEOUT_S)
        finally:
            await client.close()
        assert first.errors == ["Query processing failed"], (first.errors, qwen25.tail())
        error = next(e for e in second.events if e["type"] == "error")
        assert "engine is down (Stage-1 has no live replica)" in error.get("detail", ""), (error, qwen25.tail())
        async with aiohttp.ClientSession() as http:
            async with http.get(qwen25.url + "/healthz") as response:
                assert response.status == 503
                assert "Stage-1" in (await response.json())["detail"]
