"""`rtc-omni serve --engine vllm --workers 2` on real vLLM-Omni 0.30 on CPU (the tiny Qwen2.5-Omni): one
engine process holds the model, both workers answer through it, and when its talker dies the server
stops with a log line that says why; stopped while it loads, it leaves nothing behind
(tests/vllm_cpu/serving.py)."""

from __future__ import annotations

import math
import os
import re
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from rtc_omni.client.rtc_peers import UnderstandClient

from .vllm_cpu.serving import (
    MARKS,
    REPO,
    SHORT,
    START_TIMEOUT_S,
    TURN_TIMEOUT_S,
    Served,
    printable_only,
    serve,
    tiny_model,
    understand_client,
    vllm_python,
)

pytestmark = MARKS

MAX_CLIENTS = 12  # sessions opened until both workers own one (each lands on either: 2^-11 to miss)
ENGINE_MARK = "rtc_omni.workers.engine_process"
STOP_TIMEOUT_S = 120  # the supervisor's health check, then the engine's stop (its stage processes)


@pytest.fixture(scope="module")
def served() -> Iterator[Served]:
    yield from serve(vllm_python(), tiny_model("qwen2_5_omni"), "--workers", "2")


@pytest.fixture(scope="module")
def config() -> dict[str, Any]:
    return printable_only(SHORT, tiny_model("qwen2_5_omni"))


def process_tree(root: int) -> dict[int, list[int]]:
    """Each live process under `root` (itself included) with its children."""
    tree: dict[int, list[int]] = {}
    pending = [root]
    while pending:
        pid = pending.pop()
        children: list[int] = []
        try:
            for task in Path(f"/proc/{pid}/task").iterdir():
                children += [int(child) for child in (task / "children").read_text().split()]
        except OSError:
            continue  # it just exited
        tree[pid] = children
        pending += children
    return tree


def subtree(tree: dict[int, list[int]], root: int) -> set[int]:
    found, pending = set(), [root]
    while pending:
        pid = pending.pop()
        found.add(pid)
        pending += tree.get(pid, [])
    return found


def loaded_torch(pid: int) -> bool:
    try:
        return "libtorch_cpu.so" in Path(f"/proc/{pid}/maps").read_text()
    except OSError:
        return False


def is_engine_process(pid: int) -> bool:
    try:
        return ENGINE_MARK in Path(f"/proc/{pid}/cmdline").read_text(errors="replace")
    except OSError:
        return False


def assert_all_gone(pids: set[int]) -> None:
    """Every process of `pids` exits within STOP_TIMEOUT_S: nothing of the server is left behind."""
    deadline = time.monotonic() + STOP_TIMEOUT_S
    while (left := {pid for pid in pids if Path(f"/proc/{pid}").exists()}) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert not left, [Path(f"/proc/{pid}/cmdline").read_text(errors="replace")[:200] for pid in left]


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


def test_a_stop_while_the_engine_loads_stops_it_and_everything_it_started(tmp_path: Path) -> None:
    python, model = vllm_python(), tiny_model("qwen2_5_omni")
    log = tmp_path / "serve.log"
    command = [python, "-m", "rtc_omni", "serve", "--engine", "vllm", "--model", str(model), "--port", "0"]
    with log.open("wb") as out:
        process = subprocess.Popen(
            [*command, "--workers", "2"],
            stdout=out,
            stderr=subprocess.STDOUT,
            cwd=REPO,
            env={**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(REPO)},
        )
    try:
        # Stop it once the load is under way: a process under the engine process has loaded torch.
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:
            tree = process_tree(process.pid)
            engine = next((pid for pid in tree if is_engine_process(pid)), None)
            if engine is not None and any(loaded_torch(pid) for pid in subtree(tree, engine) - {engine}):
                break
            assert process.poll() is None and time.monotonic() < deadline, log.read_text(errors="replace")[-3000:]
            time.sleep(0.5)
        everyone = set(tree)
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=STOP_TIMEOUT_S) == 0, log.read_text(errors="replace")[-3000:]
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    text = log.read_text(errors="replace")
    assert "SIGTERM before the engine was ready: stopping it" in text and "rtc-omni: engine=" not in text, text[-3000:]
    assert_all_gone(everyone)


class TestOneEngineForTwoWorkers:
    """One server for the class; the last test kills its talker stage."""

    async def test_sessions_on_both_workers_are_answered_by_the_one_engine_process(
        self, served: Served, config: dict[str, Any]
    ) -> None:
        clients = await sessions_on_both_workers(served, config)
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

    async def test_a_dead_talker_stage_stops_the_server_with_the_reason(self, served: Served) -> None:
        # Last in the class: without a repetition penalty vLLM drops the prompt token ids the
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
        log = served.log.read_text(errors="replace")
        assert re.search(r"vLLM engine process \(pid \d+\) is unhealthy: .*Stage-1 has no live replica", log), (
            served.tail()
        )
        assert_all_gone(everyone)  # the workers, the engine process and its stage processes
