"""Qwen3-Omni MoE on real vLLM-Omni 0.30 on CPU, in a duplex session upstream: a voice-only call
with the official SDK through a gateway (`--engine remote --upstream-protocol realtime`) to vLLM-Omni's
own API server with its duplex deploy (tests/vllm_cpu/serving.py `serve_qwen3_duplex`): its
`/v1/realtime` handler, DuplexOmni, the Qwen3-Omni duplex plugin and the thinker, talker and
code2wav stages, the model tiny and random."""

from __future__ import annotations

import base64
import time
from collections.abc import Iterator

import numpy as np
import pytest

from .conftest import ServerFactory
from .genuine import gateway_to
from .realtime_client import connect
from .test_realtime_upstream_genuine import spoken_turn, voice_only
from .vllm_cpu.serving import MARKS, Served, assert_audible, serve_qwen3_duplex, timed, tiny_model, vllm_python

pytestmark = MARKS


@pytest.fixture(scope="module")
def upstream() -> Iterator[Served]:
    yield from serve_qwen3_duplex(vllm_python(), tiny_model("qwen3_omni_moe"))


async def test_a_voice_only_sdk_call_is_answered_with_audible_speech(
    upstream: Served, make_server: ServerFactory
) -> None:
    server = await gateway_to(make_server, upstream.url.replace("http://", "ws://"), upstream_protocol="realtime")
    async with connect(server) as rt:  # every event validated against the SDK's union
        await voice_only(rt)
        asked = time.monotonic()
        events = await spoken_turn(rt, 1.0)
        timed("voice turn (first append to response.done)", asked)
    assert events[-1]["response"]["status"] == "completed", (events[-3:], upstream.tail())
    assert not [e for e in rt.events if e["type"] == "error"], (rt.events, upstream.tail())
    pcm = b"".join(base64.b64decode(e["delta"]) for e in events if e["type"] == "response.output_audio.delta")
    print(f"\n[vllm-cpu] speech {len(pcm) / 48_000:.2f} s")  # 24 kHz PCM16
    assert_audible(np.frombuffer(pcm, "<i2"))
