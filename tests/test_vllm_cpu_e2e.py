"""Real vLLM-Omni 0.30 pipelines end to end on CPU: `rtc-omni serve --engine vllm` on tiny random
models (tests/vllm_cpu/tiny_models.py), real aiortc peers, what a user would notice.

The server runs in the vLLM environment (tests/vllm_cpu/env.sh), named by RTC_OMNI_VLLM_PYTHON as
for the contract checks; the peers run here. Without that environment the module skips (fails
under CI). A server starts in one to three minutes on two cores, so each model's server is
shared by the tests of its class. The models are noise: the tests check plumbing, not answers.
"""

from __future__ import annotations

import asyncio
import math
import os
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from rtc_omni.client.media import COLOURS, ColourVideoTrack, ToneAudioTrack
from rtc_omni.client.peer import GenerateClient, UnderstandClient

from .tools import require_loopback_namespace, unavailable

# A test's limit covers its share of the module's server start (pytest-timeout counts fixture setup).
pytestmark = [pytest.mark.media, pytest.mark.slow, pytest.mark.timeout(600)]

REPO = Path(__file__).resolve().parents[1]
BUILD_TIMEOUT_S = 300
START_TIMEOUT_S = 420  # vLLM-Omni's three stage processes on a busy 2-core machine
TURN_TIMEOUT_S = 120
# A few thinker tokens and talker codes (~1 s of speech): a random talker seldom ends by itself. The
# talker dict has no repetition_penalty: rtc-omni keeps the deploy's, without which the stage dies.
SHORT = {"sampling_params_list": [{"max_tokens": 12}, {"max_tokens": 48}]}
LONG = {"sampling_params_list": [{"max_tokens": 400}, {"max_tokens": 48}]}


def vllm_python() -> str:
    python = os.environ.get("RTC_OMNI_VLLM_PYTHON")
    if not python:
        unavailable(
            "RTC_OMNI_VLLM_PYTHON names no vLLM-Omni environment "
            "(bash tests/vllm_cpu/env.sh DIR builds one; then RTC_OMNI_VLLM_PYTHON=DIR/bin/python)"
        )
    require_loopback_namespace()
    return python


def timed(label: str, started: float) -> None:
    print(f"\n[vllm-cpu] {label}: {time.monotonic() - started:.1f} s", flush=True)


def build_model(python: str, name: str) -> Path:
    started = time.monotonic()
    done = subprocess.run(
        [python, str(REPO / "tests" / "vllm_cpu" / "tiny_models.py"), name],
        capture_output=True,
        text=True,
        timeout=BUILD_TIMEOUT_S,
        env={**os.environ, "HF_HUB_OFFLINE": "1"},
    )
    assert done.returncode == 0, done.stderr[-3000:]
    timed(f"{name} model ready (built or cached)", started)
    return Path(done.stdout.strip().splitlines()[-1])


@dataclass
class Served:
    """`rtc-omni serve --engine vllm --model DIR` in the vLLM environment, on 127.0.0.1."""

    url: str
    process: subprocess.Popen[bytes]
    log: Path

    def tail(self, lines: int = 60) -> str:
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])


def serve(python: str, model: Path) -> Iterator[Served]:
    log = Path(tempfile.mkstemp(prefix="vllm-cpu-serve-", suffix=".log")[1])
    started = time.monotonic()
    with log.open("wb") as out:
        process = subprocess.Popen(
            [python, "-m", "rtc_omni", "serve", "--engine", "vllm", "--model", str(model), "--port", "0"],
            stdout=out,
            stderr=subprocess.STDOUT,
            cwd=REPO,
            env={**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(REPO)},
        )
    served = Served("", process, log)
    try:
        deadline = time.monotonic() + START_TIMEOUT_S
        while not served.url:
            # A diffusion stage runs in the server's process, and vLLM prefixes that process's lines.
            lines = log.read_text(errors="replace").splitlines()
            line = next((x for x in lines if "rtc-omni: engine=" in x), "")
            if line:
                served.url = line.split(" on ")[-1].strip()
            elif process.poll() is not None or time.monotonic() > deadline:
                pytest.fail(f"rtc-omni serve --engine vllm did not start:\n{served.tail()}")
            else:
                time.sleep(0.5)
        timed(f"server ready ({model.name})", started)
        yield served
    finally:
        process.terminate()
        try:
            process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=30)
        log.unlink(missing_ok=True)


@pytest.fixture(scope="class")  # stopped before the next model's server starts
def qwen25() -> Iterator[Served]:
    python = vllm_python()
    yield from serve(python, build_model(python, "qwen2_5_omni"))


@pytest.fixture(scope="class")
def wan() -> Iterator[Served]:
    python = vllm_python()
    yield from serve(python, build_model(python, "wan"))


async def understand_client(served: Served, config: dict[str, Any]) -> UnderstandClient:
    video = ColourVideoTrack(COLOURS["red"], 160, 120, 15)
    client = UnderstandClient(served.url, video=video, audio=ToneAudioTrack(440.0))
    await client.connect()
    await client.configure(**config)
    await client.wait_event("video.frame.ack", timeout=30)
    return client


class TestQwen25OmniFullPipeline:
    """Thinker, talker and code2wav, one server for the class."""

    async def test_answers_with_text_and_audible_speech(self, qwen25: Served) -> None:
        client = await understand_client(qwen25, SHORT)
        try:
            result = await client.ask("What do you see?", timeout=TURN_TIMEOUT_S)
            second = await client.ask("And now?", timeout=TURN_TIMEOUT_S)
        finally:
            await client.close()
        for turn in (result, second):
            assert not turn.errors and not turn.cancelled, (turn.errors, qwen25.tail())
            deltas = "".join(e["delta"] for e in turn.events if e["type"] == "response.text.delta")
            done = next(e for e in turn.events if e["type"] == "response.text.done")
            assert deltas and deltas == done["text"] == turn.text
            assert turn.events[-1]["type"] == "response.audio.done"
        assert client.recorder is not None
        voiced = client.recorder.voiced_frames(result.sent_at, result.done_at or time.monotonic())
        assert voiced > 10, "the talker's speech was not audible at the peer"  # 10 frames: 200 ms
        for turn in (result, second):
            heard = [
                f.at for f in client.recorder.frames if f.at >= turn.sent_at and f.rms >= client.recorder.SILENCE_RMS
            ]
            first_audio = (heard or [math.nan])[0] - turn.sent_at
            turn_s = (turn.done_at or math.nan) - turn.sent_at
            first_text = turn.time_to_first_text or math.nan
            print(f"\n[vllm-cpu] first text {first_text:.2f} s, first audio {first_audio:.2f} s, turn {turn_s:.2f} s")

    async def test_an_interrupt_aborts_and_the_next_turn_works(self, qwen25: Served) -> None:
        client = await understand_client(qwen25, LONG)
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


class TestWan:
    async def test_generates_one_video_to_the_peer(self, wan: Served) -> None:
        client = GenerateClient(wan.url)
        await client.connect()
        try:
            sent_at = time.monotonic()
            await client.start(prompt="a red cat", size="128x128", fps=16, num_frames=17, num_inference_steps=2)
            done = await client.wait_event("session.done", timeout=TURN_TIMEOUT_S)
            await asyncio.sleep(0.5)  # the last frames are paced out at 16 fps
            frames = list(client.receiver.frames) if client.receiver is not None else []
        finally:
            await client.close()
        assert done["frames"] == 17 and not done["stopped"], (done, wan.tail())
        assert len(frames) == 17 and {(f.width, f.height) for f in frames} == {(128, 128)}
        print(f"\n[vllm-cpu] Wan: 17 frames in {time.monotonic() - sent_at:.2f} s")
