"""`rtc-omni serve --engine vllm --workers 2` on real vLLM-Omni 0.30 on CPU (the tiny Qwen2.5-Omni),
stopped while its engine process loads the model: it leaves nothing behind. The workers answering
through that engine, and the server stopping when its talker dies, are in
tests/test_vllm_cpu_qwen2_5_omni.py, which shares one model load with the single-process tests."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

from .vllm_cpu.process_tree import (
    STOP_TIMEOUT_S,
    assert_all_gone,
    is_engine_process,
    loaded_torch,
    process_tree,
    subtree,
)
from .vllm_cpu.serving import MARKS, REPO, START_TIMEOUT_S, tiny_model, vllm_python

pytestmark = MARKS


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
