"""Qwen2.5-Omni (thinker, talker, code2wav) on real vLLM-Omni 0.30 on CPU, on the tiny model: real
aiortc peers and the WebSocket endpoint (tests/vllm_cpu/serving.py).

One model load for the file: `rtc-omni serve --engine vllm --workers 2`. Its engine process is
`rtc-omni serve --engine vllm` as one process, with the server's settings, on 127.0.0.1
(rtc_omni/workers/engine_process.py): the single-process tests talk to it directly. Then the two
workers answer through it, and last, when its talker dies, the server stops with a log line that
says why. A stop while the engine loads is tests/test_vllm_cpu_workers.py.
"""

from __future__ import annotations

import asyncio
import math
import re
from collections.abc import Iterator
from typing import Any

import pytest

from rtc_omni.client.peer import UnderstandClient

from .vllm_cpu.process_tree import (
    STOP_TIMEOUT_S,
    assert_all_gone,
    is_engine_process,
    loaded_torch,
    process_tree,
    subtree,
)
from .vllm_cpu.serving import (
    LONG,
    MARKS,
    SHORT,
    TURN_TIMEOUT_S,
    Served,
    answers_with_text_and_audible_speech,
    engine_process,
    printable_only,
    serve,
    tiny_model,
    understand_client,
    vllm_python,
    websocket_answers_with_text_and_speech,
)

pytestmark = MARKS

MAX_CLIENTS = 12  # sessions opened until both workers own one (each lands on either: 2^-11 to miss)


@pytest.fixture(scope="module")
def served() -> Iterator[Served]:
    yield from serve(vllm_python(), tiny_model("qwen2_5_omni"), "--workers", "2")


@pytest.fixture(scope="module")
def single(served: Served) -> Served:
    """The engine process, a single-process server of its own."""
    return engine_process(served)


@pytest.fixture(scope="module")
def configs() -> dict[str, dict[str, Any]]:
    model = tiny_model("qwen2_5_omni")
    return {"short": printable_only(SHORT, model), "long": printable_only(LONG, model)}


class TestQwen25OmniFullPipeline:
    """Thinker, talker and code2wav, in one process."""

    async def test_answers_with_text_and_audible_speech(self, single: Served, configs: dict[str, Any]) -> None:
        await answers_with_text_and_audible_speech(single, configs["short"], turns=2)

    async def test_the_same_model_over_the_websocket_endpoint(self, single: Served, configs: dict[str, Any]) -> None:
        await websocket_answers_with_text_and_speech(single, configs["short"])

    async def test_an_interrupt_aborts_and_the_next_turn_works(self, single: Served, configs: dict[str, Any]) -> None:
        client = await understand_client(single, configs["long"])
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
                while aborted not in single.tail(2000):
                    await asyncio.sleep(0.2)
            result = await second
        finally:
            await client.close()
        # Cut mid-answer: the engine had not finished the request (text.done follows the engine's last output).
        interrupted = [e["type"] for e in client.events[mark:] if e.get("request_id") == start["request_id"]]
        assert "response.text.delta" in interrupted and interrupted[-1] == "response.cancelled", interrupted
        assert "response.text.done" not in interrupted and "response.audio.done" not in interrupted, interrupted
        assert not result.errors and not result.cancelled and result.text, (result.errors, single.tail())
        assert result.events[-1]["type"] == "response.audio.done"


async def sessions_on_both_workers(served: Served, config: dict[str, Any]) -> list[UnderstandClient]:
    """One camera-and-mic session owned by each worker (the kernel hands each offer to either)."""
    owned: dict[str, UnderstandClient] = {}
    try:
        for _ in range(MAX_CLIENTS):
            client = await understand_client(served, config)
            assert client.session_id is not None
            worker = client.session_id.split(".", 1)[0]
            if worker in owned:
                await client.close()
                continue
            owned[worker] = client
            if len(owned) == 2:
                return [owned["w0"], owned["w1"]]
    except BaseException:
        for client in owned.values():
            await client.close()
        raise
    for client in owned.values():
        await client.close()
    raise AssertionError(f"{MAX_CLIENTS} sessions all went to {set(owned)}")


class TestOneEngineForTwoWorkers:
    """The workers in front of that engine process; the last test kills its talker stage."""

    async def test_sessions_on_both_workers_are_answered_by_the_one_engine_process(
        self, served: Served, configs: dict[str, Any]
    ) -> None:
        clients = await sessions_on_both_workers(served, configs["short"])
        try:
            results = [await client.ask("What do you see?", timeout=TURN_TIMEOUT_S) for client in clients]
        finally:
            for client in clients:
                await client.close()
        for client, turn in zip(clients, results, strict=True):
            assert not turn.errors and not turn.cancelled, (client.session_id, turn.errors, served.tail())
            done = next(e for e in turn.events if e["type"] == "response.text.done")
            assert turn.text and done["text"] == turn.text
            assert turn.events[-1]["type"] == "response.audio.done", turn.events[-3:]
            assert client.recorder is not None
            voiced = client.recorder.voiced_frames(turn.sent_at, turn.done_at or turn.sent_at + TURN_TIMEOUT_S)
            assert voiced > 10, f"the talker's speech was not audible at {client.session_id}'s peer"
            first_text, turn_s = turn.time_to_first_text or math.nan, (turn.done_at or math.nan) - turn.sent_at
            print(f"\n[vllm-cpu] {client.session_id}: first text {first_text:.2f} s, turn {turn_s:.2f} s")

        tree = process_tree(served.process.pid)
        engines = [pid for pid in tree if is_engine_process(pid)]
        assert len(engines) == 1, engines
        (engine,) = engines
        workers = [pid for pid in tree[served.process.pid] if pid != engine]
        assert len(workers) == 2, tree
        # The model lives in the engine process and its stage processes only: no worker loaded torch.
        holding_torch = {pid for pid in tree if loaded_torch(pid)}
        assert engine in holding_torch and holding_torch <= subtree(tree, engine), (holding_torch, tree)
        assert not {served.process.pid, *workers} & holding_torch

    async def test_a_dead_talker_stage_makes_health_fail_and_stops_the_server_with_the_reason(
        self, served: Served
    ) -> None:
        # Last in the file: without a repetition penalty vLLM drops the prompt token ids the
        # Qwen2.5-Omni talker needs, and the stage dies for good (docs/vllm.md).
        everyone = set(process_tree(served.process.pid))
        fatal = {"sampling_params_list": [{"max_tokens": 4}, {"max_tokens": 8, "repetition_penalty": 1.0}]}
        client = await understand_client(served, fatal)
        mark = len(client.events)
        try:
            first = await client.ask("Hello?", timeout=TURN_TIMEOUT_S)
        except TimeoutError as exc:
            pytest.fail(f"{exc}; the client heard {client.events[mark:]}\n{served.tail()}")
        finally:
            await client.close()
        error = next(e for e in first.events if e["type"] == "error")
        heard_after = client.event_times[client.events.index(error)] - first.sent_at
        print(f"\n[vllm-cpu] the failed turn's error, {heard_after:.2f} s after the query: {error}")
        assert first.errors == ["Query processing failed"], (first.errors, served.tail())
        assert error["detail"].startswith("upstream: Query processing failed: "), error  # with the engine's reason
        assert served.process.wait(timeout=STOP_TIMEOUT_S) == 1, served.tail()
        # The engine process's /health (the same handler as /healthz) answered 503 with vLLM-Omni's reason.
        log = served.log.read_text(errors="replace")
        assert re.search(r"vLLM engine process \(pid \d+\) is unhealthy: .*Stage-1 has no live replica", log), (
            served.tail()
        )
        assert_all_gone(everyone)  # the workers, the engine process and its stage processes
