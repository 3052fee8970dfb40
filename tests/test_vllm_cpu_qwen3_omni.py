"""Qwen3-Omni MoE (thinker, talker, code2wav) on real vLLM-Omni 0.30 on CPU: one turn over a real
aiortc peer and one over the WebSocket endpoint (tests/vllm_cpu/serving.py)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from .vllm_cpu.serving import (
    MARKS,
    QWEN3_SHORT,
    Served,
    answers_with_text_and_audible_speech,
    printable_only,
    serve,
    tiny_model,
    vllm_python,
    websocket_answers_with_text_and_speech,
)

pytestmark = MARKS


@pytest.fixture(scope="module")
def qwen3() -> Iterator[Served]:
    yield from serve(vllm_python(), tiny_model("qwen3_omni_moe"))


@pytest.fixture(scope="module")
def short() -> dict[str, Any]:
    return printable_only(QWEN3_SHORT, tiny_model("qwen3_omni_moe"))


class TestQwen3OmniFullPipeline:
    """Qwen3-Omni MoE: thinker, talker (with its code predictor) and code2wav, one server."""

    async def test_answers_with_text_and_audible_speech(self, qwen3: Served, short: dict[str, Any]) -> None:
        await answers_with_text_and_audible_speech(qwen3, short, turns=1)

    async def test_the_same_model_over_the_websocket_endpoint(self, qwen3: Served, short: dict[str, Any]) -> None:
        await websocket_answers_with_text_and_speech(qwen3, short)
