"""What the real-vLLM-Omni end-to-end tests share (tests/test_vllm_cpu_*.py): the tiny model
builds, `rtc-omni serve --engine vllm` in the vLLM environment, and the turns they check.

The server runs in the vLLM environment (tests/vllm_cpu/env.sh), named by RTC_OMNI_VLLM_PYTHON as
for the contract checks; the peers run here. Without that environment the tests skip (fail under
CI). A server starts in half a minute to two minutes on two cores, so each model's server is
shared by the tests of its file, and each model family has a file of its own, so that the suite's
workers start them side by side. The models are noise: the tests check plumbing, not answers.
"""

from __future__ import annotations

import asyncio
import base64
import dataclasses
import functools
import io
import json
import math
import os
import re
import subprocess
import tempfile
import time
import wave
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import av
import numpy as np
import pytest

from rtc_omni.client.media import COLOURS, ColourVideoTrack, ToneAudioTrack
from rtc_omni.client.rtc_peers import UnderstandClient
from rtc_omni.engines.vllm_cpu.deploy import CPU_ENVIRONMENT, LAYOUTS, overlay

from ..tools import free_port, require_loopback_namespace, unavailable
from ..wsclient import WsClient, jpeg_b64, tone_pcm_b64

# Marks for every file of these tests: a test's limit covers its share of its file's server start
# (pytest-timeout counts fixture setup).
MARKS = [pytest.mark.media, pytest.mark.slow, pytest.mark.timeout(600)]

REPO = Path(__file__).resolve().parents[2]
BUILD_TIMEOUT_S = 300
START_TIMEOUT_S = 420  # vLLM-Omni's three stage processes on a busy 2-core machine
TURN_TIMEOUT_S = 120
PLAYOUT_S = 1.0  # how long speech the server has sent takes to play at the peer, at most
# A few thinker tokens and talker codes (~1 s of speech). The random talker can end by itself, after
# as few as 2 codes (57 ms of speech, once in a CI run): `min_tokens` holds it to enough to be heard
# (with min 150 / max 200 it ended by itself at 172). The talker dict has no repetition_penalty:
# rtc-omni keeps the deploy's, without which the stage dies.
THINKER = {"max_tokens": 12}
SHORT = {"sampling_params_list": [THINKER, {"max_tokens": 48, "min_tokens": 24}]}
# 12-24 talker codes: 1-2 s of speech at Qwen3-Omni's 12.5 codes a second.
QWEN3_SHORT = {"sampling_params_list": [THINKER, {"max_tokens": 24, "min_tokens": 12}]}


def printable_only(config: dict[str, Any], model: Path) -> dict[str, Any]:
    """`config` with the thinker limited to the tokens that print (vLLM's `allowed_token_ids`).

    The tiny thinker favours them by the scale of its head only: for some inputs and some draws of
    its weights (a build is not reproducible) it picks ids the tokenizer lacks and writes no text."""
    vocab: dict[str, int] = json.loads((model / "tokenizer.json").read_text())["model"]["vocab"]
    printable = {chr(c) for c in range(33, 127)} | {"Ġ"}  # "Ġ" is the byte-level space
    allowed = sorted(i for token, i in vocab.items() if set(token) <= printable and not token.startswith("<|"))
    thinker, *rest = config["sampling_params_list"]
    return {**config, "sampling_params_list": [{**thinker, "allowed_token_ids": allowed}, *rest]}


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


# Built in one process, in this order, whichever model a test needs. The builders seed torch, but a
# model's random weights still depend on what the process built before it (the Qwen3-Omni built
# alone is a different draw, whose thinker writes no text for the test's camera and tone).
TINY_MODELS = ["qwen2_5_omni", "qwen3_omni_moe", "helios", "wan"]


def tiny_model(name: str) -> Path:
    """The tiny model `name`, with the others, built here or found in the cache (tests/vllm_cpu/tiny_models.py)."""
    return tiny_models(vllm_python())[name]


@functools.cache
def tiny_models(python: str) -> dict[str, Path]:
    """Every tiny model, by name: one build (or cache lookup) per test process."""
    started = time.monotonic()
    done = subprocess.run(
        [python, str(REPO / "tests" / "vllm_cpu" / "tiny_models.py"), *TINY_MODELS],
        capture_output=True,
        text=True,
        timeout=BUILD_TIMEOUT_S,
        env={**os.environ, "HF_HUB_OFFLINE": "1"},
    )
    assert done.returncode == 0, done.stderr[-3000:]
    timed("tiny models ready (built or cached)", started)
    built = done.stdout.strip().splitlines()[-len(TINY_MODELS) :]
    return {name: Path(path) for name, path in zip(TINY_MODELS, built, strict=True)}


@dataclass
class Served:
    """`rtc-omni serve --engine vllm --model DIR` in the vLLM environment, on 127.0.0.1."""

    url: str
    process: subprocess.Popen[bytes]
    log: Path

    def tail(self, lines: int = 60) -> str:
        """The log's last lines, after the exception lines from anywhere in it: with several stage
        processes the root cause is often far above the end."""
        text = self.log.read_text(errors="replace").splitlines()
        causes = dict.fromkeys(x for x in text if re.search(r"\w+(Error|Exception): ", x))
        return "\n".join(["exceptions:", *list(causes)[:12], "last lines:", *text[-lines:]])


def serve(python: str, model: Path, *options: str) -> Iterator[Served]:
    """`rtc-omni serve --engine vllm --model MODEL` in the vLLM environment, until the caller is done."""

    def url(lines: list[str]) -> str:
        # A diffusion stage runs in the server's process, and vLLM prefixes that process's lines.
        line = next((x for x in lines if "rtc-omni: engine=" in x), "")
        return line.split(" on ")[-1].split()[0] if line else ""  # past it, " (2 workers)" with --workers 2

    argv = [python, "-m", "rtc_omni", "serve", "--engine", "vllm", "--model", str(model), "--port", "0", *options]
    yield from _run(argv, f"rtc-omni serve --engine vllm ({model.name})", url, {})


def serve_qwen3_duplex(python: str, model: Path) -> Iterator[Served]:
    """vLLM-Omni's own API server (`vllm-omni serve MODEL --omni`) with its Qwen3-Omni duplex deploy
    on CPU: `/v1/realtime` duplex sessions, answered with `QWEN3_SHORT`'s lengths (a session's
    sampling parameters are the deploy's defaults) by a thinker held to printable tokens."""
    layout = dataclasses.replace(LAYOUTS["qwen3_omni_moe"], base_yaml="qwen3_omni_duplex.yaml")
    site = subprocess.run(
        [python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], capture_output=True, text=True
    )
    deploy = overlay(layout, Path(site.stdout.strip()) / "vllm_omni" / "deploy")
    thinker, talker = printable_only(QWEN3_SHORT, model)["sampling_params_list"]
    for stage, params in zip(deploy["stages"], (thinker, talker), strict=False):  # code2wav keeps its own
        stage["default_sampling_params"] = params
    with tempfile.TemporaryDirectory(prefix="vllm-cpu-duplex-") as folder:
        path = Path(folder) / "deploy.yaml"
        path.write_text(json.dumps(deploy))  # YAML reads JSON
        port = free_port()
        argv = [python, "-m", "vllm_omni.entrypoints.cli.main", "serve", str(model), "--omni"]
        argv += ["--deploy-config", str(path), "--host", "127.0.0.1", "--port", str(port)]

        def url(lines: list[str]) -> str:
            # uvicorn's line once vLLM-Omni's server accepts connections (its address is --port's)
            return f"http://127.0.0.1:{port}" if any("Application startup complete" in x for x in lines) else ""

        yield from _run(argv, f"vllm-omni serve ({model.name}, duplex)", url, CPU_ENVIRONMENT)


def _run(argv: list[str], name: str, url: Callable[[list[str]], str], environment: dict[str, str]) -> Iterator[Served]:
    """The server `argv` (in the vLLM environment), once `url` finds its address in its log lines."""
    log = Path(tempfile.mkstemp(prefix="vllm-cpu-serve-", suffix=".log")[1])
    started = time.monotonic()
    with log.open("wb") as out:
        process = subprocess.Popen(
            argv,
            stdout=out,
            stderr=subprocess.STDOUT,
            cwd=REPO,
            env={**environment, **os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(REPO)},
        )
    served = Served("", process, log)
    try:
        deadline = time.monotonic() + START_TIMEOUT_S
        while not (address := url(log.read_text(errors="replace").splitlines())):
            if process.poll() is not None or time.monotonic() > deadline:
                pytest.fail(f"{name} did not start:\n{served.tail()}")
            time.sleep(0.5)
        served.url = address
        timed(f"server ready: {name}", started)
        yield served
    finally:
        process.terminate()
        try:
            process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=30)
        log.unlink(missing_ok=True)


async def understand_client(served: Served, config: dict[str, Any]) -> UnderstandClient:
    video = ColourVideoTrack(COLOURS["red"], 160, 120, 15)
    client = UnderstandClient(served.url, video=video, audio=ToneAudioTrack(440.0))
    await client.connect()
    await client.configure(**config)
    await client.wait_event("video.frame.ack", timeout=30)
    return client


async def answers_with_text_and_audible_speech(served: Served, config: dict[str, Any], turns: int) -> None:
    """`turns` questions over one real peer: each answer's text deltas join to response.text.done,
    it ends with the talker's audio, and the first one is audible at the peer."""
    client = await understand_client(served, config)
    results = []
    try:
        for question in ("What do you see?", "And now?")[:turns]:
            results.append(await client.ask(question, timeout=TURN_TIMEOUT_S))
        await asyncio.sleep(PLAYOUT_S)  # the last words still in flight when response.audio.done came
    finally:
        await client.close()
    for turn in results:
        assert not turn.errors and not turn.cancelled, (turn.errors, served.tail())
        deltas = "".join(e["delta"] for e in turn.events if e["type"] == "response.text.delta")
        done = next(e for e in turn.events if e["type"] == "response.text.done")
        assert deltas and deltas == done["text"] == turn.text, (deltas, done, turn.text)
        assert turn.events[-1]["type"] == "response.audio.done", turn.events[-3:]
    assert client.recorder is not None
    # The first answer's speech, up to the next question: response.audio.done comes when the server
    # has sent the last of it, a network and jitter buffer ahead of the peer.
    until = results[1].sent_at if len(results) > 1 else (results[0].done_at or time.monotonic()) + PLAYOUT_S
    voiced = client.recorder.voiced_frames(results[0].sent_at, until)
    loudest = max((f.rms for f in client.recorder.frames if results[0].sent_at <= f.at <= until), default=0.0)
    # 10 frames: 200 ms
    assert voiced > 10, ("the talker's speech was not audible at the peer", voiced, loudest, served.tail(20))
    for turn in results:
        heard = [f.at for f in client.recorder.frames if f.at >= turn.sent_at and f.rms >= client.recorder.SILENCE_RMS]
        first_audio = (heard or [math.nan])[0] - turn.sent_at
        turn_s = (turn.done_at or math.nan) - turn.sent_at
        first_text = turn.time_to_first_text or math.nan
        print(f"\n[vllm-cpu] first text {first_text:.2f} s, first audio {first_audio:.2f} s, turn {turn_s:.2f} s")


async def websocket_answers_with_text_and_speech(served: Served, config: dict[str, Any]) -> None:
    """One turn through vLLM-Omni's `WS /v1/video/chat/stream` (a plain WebSocket client, as a
    vLLM-Omni client would be): text deltas, then the talker's speech as audible 24 kHz WAV chunks."""
    client = await WsClient.connect(served.url.replace("http://", "ws://") + "/v1/video/chat/stream")
    try:
        await client.send({"type": "session.config", **config})
        await client.send({"type": "video.frame", "data": jpeg_b64((230, 20, 20)), "frame_id": "f1"})
        await client.wait_event("video.frame.ack", timeout=30)
        await client.send({"type": "audio.chunk", "data": tone_pcm_b64(440, 1.0)})
        sent_at = time.monotonic()
        await client.send({"type": "video.query", "text": "What do you see and hear?"})
        await client.wait_event("response.audio.done", timeout=TURN_TIMEOUT_S)
        timed("WebSocket turn", sent_at)
    finally:
        await client.close()
    events = client.events
    assert not [e for e in events if e["type"] == "error"], (events, served.tail())
    text = "".join(e["delta"] for e in events if e["type"] == "response.text.delta")
    done = next(e for e in events if e["type"] == "response.text.done")
    # The reference's order: text.done goes out at the first audio output with the text so far.
    assert text and text.startswith(done["text"])
    samples = []
    for event in (e for e in events if e["type"] == "response.audio.delta"):
        with wave.open(io.BytesIO(base64.b64decode(event["data"]))) as wav:
            assert (wav.getframerate(), wav.getnchannels(), wav.getsampwidth()) == (24_000, 1, 2)
            samples.append(np.frombuffer(wav.readframes(wav.getnframes()), "<i2"))
    assert_audible(np.concatenate(samples) if samples else np.zeros(0, "<i2"))


def assert_audible(pcm16: np.ndarray) -> None:
    """The talker's 24 kHz speech: over 200 ms of it, and not silence."""
    speech = pcm16.astype(np.float64) / 32768
    rms = float(np.sqrt(np.mean(speech**2))) if speech.size else 0.0
    assert speech.size > 24_000 // 5 and rms > 0.01, (speech.size, rms)


async def websocket_generates(served: Served, request: dict[str, Any], chunks: int, frames: int) -> None:
    """One generation through vLLM-Omni's `WS /v1/realtime/video`: fMP4 chunks, each announced by its
    `video.chunk_metadata`, that demux into every frame."""
    client = await WsClient.connect(served.url.replace("http://", "ws://") + "/v1/realtime/video")
    try:
        sent_at = time.monotonic()
        await client.send({"type": "session.start", "size": "128x128", "fps": 16, **request})
        await client.wait_closed(timeout=TURN_TIMEOUT_S * 2)
        timed("WebSocket generation", sent_at)
    finally:
        await client.close()
    events = client.events
    assert events and events[-1]["type"] == "session.done", (events, served.tail())
    media = [e for e in events if e["type"] == "video.chunk_metadata" and e["kind"] == "media"]
    assert [e["generation_chunk_index"] for e in media] == list(range(chunks)), events
    data = b"".join(client.binaries)
    with av.open(io.BytesIO(data), mode="r", format="mp4") as container:
        decoded = [(f.width, f.height) for f in container.decode(video=0)]
    assert decoded == [(128, 128)] * frames and events[-1]["frames"] == frames
