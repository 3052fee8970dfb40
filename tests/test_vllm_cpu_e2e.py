"""Real vLLM-Omni 0.30 pipelines end to end on CPU: `rtc-omni serve --engine vllm` on tiny random
models (tests/vllm_cpu/tiny_models.py), real aiortc peers, what a user would notice.

The server runs in the vLLM environment (tests/vllm_cpu/env.sh), named by RTC_OMNI_VLLM_PYTHON as
for the contract checks; the peers run here. Without that environment the module skips (fails
under CI). A server starts in one to three minutes on two cores, so each model's server is
shared by the tests of its class. The models are noise: the tests check plumbing, not answers.
"""

from __future__ import annotations

import asyncio
import base64
import io
import json
import math
import os
import re
import subprocess
import tempfile
import time
import wave
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import av
import numpy as np
import pytest

from rtc_omni.client.media import COLOURS, ColourVideoTrack, ToneAudioTrack
from rtc_omni.client.peer import GenerateClient, UnderstandClient

from .tools import require_loopback_namespace, unavailable
from .wsclient import WsClient, jpeg_b64, tone_pcm_b64

# A test's limit covers its share of the module's server start (pytest-timeout counts fixture setup).
pytestmark = [pytest.mark.media, pytest.mark.slow, pytest.mark.timeout(600)]

REPO = Path(__file__).resolve().parents[1]
BUILD_TIMEOUT_S = 300
START_TIMEOUT_S = 420  # vLLM-Omni's three stage processes on a busy 2-core machine
TURN_TIMEOUT_S = 120
# A few thinker tokens and talker codes (~1 s of speech): a random talker seldom ends by itself. The
# talker dict has no repetition_penalty: rtc-omni keeps the deploy's, without which the stage dies.
SHORT = {"sampling_params_list": [{"max_tokens": 12}, {"max_tokens": 48}]}
# 24 talker codes: ~2 s of speech at Qwen3-Omni's 12.5 codes a second.
QWEN3_SHORT = {"sampling_params_list": [{"max_tokens": 12}, {"max_tokens": 24}]}
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


@pytest.fixture(scope="module")
def tiny_models() -> dict[str, Path]:
    """Every tiny model the module serves, built (or found cached) in one process: a cold build is
    mostly imports, so one process for the four saves about 25 s."""
    python = vllm_python()
    names = ["qwen2_5_omni", "qwen3_omni_moe", "helios", "wan"]
    started = time.monotonic()
    done = subprocess.run(
        [python, str(REPO / "tests" / "vllm_cpu" / "tiny_models.py"), *names],
        capture_output=True,
        text=True,
        timeout=BUILD_TIMEOUT_S,
        env={**os.environ, "HF_HUB_OFFLINE": "1"},
    )
    assert done.returncode == 0, done.stderr[-3000:]
    timed("tiny models ready (built or cached)", started)
    return dict(zip(names, (Path(line) for line in done.stdout.strip().splitlines()[-len(names) :]), strict=True))


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
    log = Path(tempfile.mkstemp(prefix="vllm-cpu-serve-", suffix=".log")[1])
    started = time.monotonic()
    with log.open("wb") as out:
        process = subprocess.Popen(
            [python, "-m", "rtc_omni", "serve", "--engine", "vllm", "--model", str(model), "--port", "0", *options],
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
def qwen25(tiny_models: dict[str, Path]) -> Iterator[Served]:
    yield from serve(vllm_python(), tiny_models["qwen2_5_omni"])


@pytest.fixture(scope="class")
def qwen3(tiny_models: dict[str, Path]) -> Iterator[Served]:
    yield from serve(vllm_python(), tiny_models["qwen3_omni_moe"])


@pytest.fixture(scope="class")
def helios(tiny_models: dict[str, Path]) -> Iterator[Served]:
    yield from serve(vllm_python(), tiny_models["helios"], "--engine-arg", "diffusion-streaming-output")


@pytest.fixture(scope="class")
def wan(tiny_models: dict[str, Path]) -> Iterator[Served]:
    yield from serve(vllm_python(), tiny_models["wan"])


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
    finally:
        await client.close()
    for turn in results:
        assert not turn.errors and not turn.cancelled, (turn.errors, served.tail())
        deltas = "".join(e["delta"] for e in turn.events if e["type"] == "response.text.delta")
        done = next(e for e in turn.events if e["type"] == "response.text.done")
        assert deltas and deltas == done["text"] == turn.text
        assert turn.events[-1]["type"] == "response.audio.done"
    assert client.recorder is not None
    voiced = client.recorder.voiced_frames(results[0].sent_at, results[0].done_at or time.monotonic())
    assert voiced > 10, "the talker's speech was not audible at the peer"  # 10 frames: 200 ms
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
    speech = np.concatenate(samples).astype(np.float64) / 32768 if samples else np.zeros(0)
    rms = float(np.sqrt(np.mean(speech**2))) if speech.size else 0.0
    assert speech.size > 24_000 // 5 and rms > 0.01, (speech.size, rms)  # over 200 ms, not silence


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


class TestQwen25OmniFullPipeline:
    """Thinker, talker and code2wav, one server for the class."""

    async def test_answers_with_text_and_audible_speech(self, qwen25: Served) -> None:
        await answers_with_text_and_audible_speech(qwen25, SHORT, turns=2)

    async def test_the_same_model_over_the_websocket_endpoint(self, qwen25: Served) -> None:
        await websocket_answers_with_text_and_speech(qwen25, SHORT)

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


class TestQwen3OmniFullPipeline:
    """Qwen3-Omni MoE: thinker, talker (with its code predictor) and code2wav, one server."""

    async def test_answers_with_text_and_audible_speech(self, qwen3: Served) -> None:
        await answers_with_text_and_audible_speech(qwen3, QWEN3_SHORT, turns=1)

    async def test_the_same_model_over_the_websocket_endpoint(self, qwen3: Served) -> None:
        await websocket_answers_with_text_and_speech(qwen3, QWEN3_SHORT)


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

    async def test_the_same_model_over_the_websocket_endpoint(self, wan: Served) -> None:
        await websocket_generates(wan, {"prompt": "a red cat", "num_frames": 17, "num_inference_steps": 2}, 1, 17)


class TestHeliosStreaming:
    """Helios served with `--engine-arg diffusion-streaming-output`: one 33-frame chunk at a time."""

    CHUNKS = 5
    FRAMES_PER_CHUNK = 33  # Helios's 9 latent frames a chunk

    async def test_streams_chunks_and_an_interaction_starts_where_announced(self, helios: Served) -> None:
        client = GenerateClient(helios.url)
        await client.connect()
        frames_total = self.CHUNKS * self.FRAMES_PER_CHUNK
        change = {"event_id": "evt-blue", "event": {"prompt": "a blue sky"}, "transition_chunks": 2}
        try:
            sent_at = time.monotonic()
            await client.start(
                prompt="a red cat", size="128x128", fps=16, num_frames=frames_total, num_inference_steps=2
            )
            await client.wait_event("video.chunk_metadata", timeout=TURN_TIMEOUT_S)
            timed("Helios first chunk", sent_at)
            # Sent as chunk 0 arrives: vLLM-Omni is then computing chunk 1 (several seconds on CPU).
            mark = len(client.events)
            client.send({"type": "session.interaction", "interaction": change})
            queued = await client.wait_event("session.interaction.queued", after=mark, timeout=30)
            done = await client.wait_event("session.done", timeout=TURN_TIMEOUT_S * 2)
            timed(f"Helios {done['chunks']} chunks", sent_at)
            await asyncio.sleep(1.0)  # the last frames are paced out at 16 fps
            frames = list(client.receiver.frames) if client.receiver is not None else []
        finally:
            await client.close()
        assert not [e for e in client.events if e["type"] == "error"], (client.events, helios.tail())
        reports = [e for e in client.events if e["type"] == "video.chunk_metadata"]
        # One report a chunk, numbered by vLLM-Omni, covering the frames in order.
        assert [r["generation_chunk_index"] for r in reports] == list(range(self.CHUNKS)), (reports, helios.tail())
        assert [r["num_frames"] for r in reports] == [self.FRAMES_PER_CHUNK] * self.CHUNKS
        assert [(r["first_frame_index"], r["last_frame_index"]) for r in reports] == [
            (i * self.FRAMES_PER_CHUNK, (i + 1) * self.FRAMES_PER_CHUNK - 1) for i in range(self.CHUNKS)
        ]
        assert done["chunks"] == self.CHUNKS and done["frames"] == frames_total and not done["stopped"]
        assert len(frames) == frames_total and {(f.width, f.height) for f in frames} == {(128, 128)}
        # The interaction starts in the chunk we announced, is active for its transition and completes.
        start = queued["apply_from_chunk"]
        assert queued["event_id"] == "evt-blue"
        started = [r["generation_chunk_index"] for r in reports if "evt-blue" in r["started_event_ids"]]
        active = [r["generation_chunk_index"] for r in reports if "evt-blue" in r["active_event_ids"]]
        completed = [r["generation_chunk_index"] for r in reports if "evt-blue" in r["completed_event_ids"]]
        print(f"\n[vllm-cpu] interaction queued for chunk {start}; vLLM-Omni: started {started}, active {active}")
        assert started == [start], (queued, reports)
        assert active == [start, start + 1] and completed == [start + 1], (queued, reports)
        # Those lists are vLLM-Omni's own: the server logs each report that names an interaction as
        # it came from the engine (without one, the session would derive the lists from its schedule).
        marker = "vLLM-Omni chunk report for "
        logged = [
            json.loads(line.split(marker, 1)[1].split(": ", 1)[1])
            for line in helios.log.read_text(errors="replace").splitlines()
            if marker in line
        ]
        assert [(r["generation_chunk_index"], r["started_event_ids"], r["active_event_ids"]) for r in logged] == [
            (r["generation_chunk_index"], r["started_event_ids"], r["active_event_ids"]) for r in reports[start:]
        ], (logged, reports)

    async def test_the_same_model_over_the_websocket_endpoint(self, helios: Served) -> None:
        request = {"prompt": "a red cat", "num_frames": 2 * self.FRAMES_PER_CHUNK, "num_inference_steps": 2}
        await websocket_generates(helios, request, 2, 2 * self.FRAMES_PER_CHUNK)
