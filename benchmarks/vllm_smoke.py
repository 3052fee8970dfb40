"""Smoke benchmark of `--engine vllm`: understanding turns or one generation, end to end, on a GPU
with a real model or on CPU with a tiny one.

On a machine with a CUDA GPU, vLLM-Omni (`pip install -e ".[vllm]"`) and the model's weights:

  python benchmarks/vllm_smoke.py --model Qwen/Qwen3-Omni-30B-A3B-Instruct
  python benchmarks/vllm_smoke.py --model BestWishYsh/Helios-Distilled --engine-arg diffusion-streaming-output

On CPU, in the vLLM-Omni CPU environment (docs/vllm.md), with a tiny random model from
tests/vllm_cpu/tiny_models.py, inside a loopback-only network namespace:

  DIR/bin/python benchmarks/vllm_smoke.py --model "$(DIR/bin/python tests/vllm_cpu/tiny_models.py qwen2_5_omni)" \
      --turns 5 --max-tokens 12 --talker-max-tokens 48
  DIR/bin/python benchmarks/vllm_smoke.py --model "$(DIR/bin/python tests/vllm_cpu/tiny_models.py wan)" \
      --size 128x128 --frames 17 --steps 2

It serves the model in-process on 127.0.0.1, connects a headless aiortc peer (a red camera and a
440 Hz tone, or a prompt), and prints the load time, time to first text and first audio per turn
(p50/p95 over the turns), or frames/s, and the memory the server holds (GPU memory from
nvidia-smi, or the resident memory of the server and its stage processes on CPU). Further
`vllm serve --omni` arguments go through --engine-arg KEY=VALUE (or a bare KEY for a switch).
"""

from __future__ import annotations

import argparse
import asyncio
import math
import os
import subprocess
import time
from typing import Any

from aiohttp.test_utils import TestServer

from rtc_omni.app import create_app
from rtc_omni.bench.common import silent_from, summary
from rtc_omni.client.media import COLOURS, ColourVideoTrack, ToneAudioTrack
from rtc_omni.client.rtc_peers import GenerateClient, UnderstandClient
from rtc_omni.config import Settings
from rtc_omni.signaling.keys import ENGINES


def gpu_memory() -> str | None:
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=memory.used,memory.total", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=10,
        ).stdout.strip()
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.replace("\n", "; ") or None


def resident_mib(pid: int) -> float:
    """Resident memory of `pid` and its descendants (the stage processes), shared pages counted per process."""
    total = 0.0
    pending = [pid]
    while pending:
        current = pending.pop()
        try:
            with open(f"/proc/{current}/status") as status:
                total += next(int(line.split()[1]) for line in status if line.startswith("VmRSS:")) / 1024
            for thread in os.listdir(f"/proc/{current}/task"):  # a child belongs to the thread that started it
                with open(f"/proc/{current}/task/{thread}/children") as children:
                    pending.extend(int(child) for child in children.read().split())
        except (OSError, StopIteration, ValueError):
            continue
    return total


def memory() -> str:
    return gpu_memory() or f"{resident_mib(os.getpid()) / 1024:.2f} GiB resident (server and stage processes)"


async def played_out(client: UnderstandClient, since: float, timeout: float = 60.0) -> None:
    """Wait until the talker's audio has played out (it plays in real time after the text ends), so
    the next turn's first audio is its own."""
    deadline = time.monotonic() + timeout
    recorder = client.recorder
    while recorder is not None and silent_from(recorder, since, run=10) is None and time.monotonic() < deadline:
        await asyncio.sleep(0.2)


async def understand(url: str, turns: int, config: dict[str, Any]) -> None:
    client = UnderstandClient(url, video=ColourVideoTrack(COLOURS["red"], 640, 480, 30), audio=ToneAudioTrack(440))
    await client.connect()
    try:
        await client.configure(**config)
        await client.wait_event("video.frame.ack", timeout=60)
        await asyncio.sleep(1.0)
        first_text: list[float] = []
        first_audio: list[float] = []
        totals: list[float] = []
        for turn in range(turns):
            result = await client.ask("What colour do you see, and what do you hear?", timeout=300)
            if result.errors:
                print(f"turn {turn + 1}: errors {result.errors}")
                continue
            if turn == 0:
                print(f"answer: {result.text!r}")
            recorder = client.recorder
            assert recorder is not None  # the client records the talker whenever it sends audio
            voiced = [f.at for f in recorder.frames if f.at > result.sent_at and f.rms >= recorder.SILENCE_RMS]
            heard = voiced[0] if voiced else None
            first_text.append(result.time_to_first_text or math.nan)
            if heard is not None:
                first_audio.append(heard - result.sent_at)
            totals.append((result.done_at or math.nan) - result.sent_at)
            await played_out(client, result.done_at or time.monotonic())
        print(f"{len(totals)}/{turns} turns answered")
        print(f"time to first text: {summary(first_text)}")
        print(f"time to first audio: {summary(first_audio) if first_audio else 'no audio heard'}")
        print(f"turn: {summary(totals)}")
    finally:
        await client.close()


async def generate(url: str, size: str, frames: int, steps: int | None) -> None:
    client = GenerateClient(url)
    await client.connect()
    try:
        started = time.monotonic()
        request: dict[str, Any] = {"prompt": "a red kite over the sea", "size": size, "fps": 16, "num_frames": frames}
        if steps is not None:
            request["num_inference_steps"] = steps
        await client.start(timeout=600, **request)
        done = await client.wait_event("session.done", timeout=1800)
        await asyncio.sleep(0.5)
        received = list(client.receiver.frames) if client.receiver is not None else []
    finally:
        await client.close()
    span = received[-1].at - received[0].at if len(received) > 1 else 0.0
    print(
        f"{len(received)}/{done['frames']} frames; first frame after {received[0].at - started:.2f} s; "
        f"{(len(received) - 1) / span:.2f} frames/s"
        if span
        else f"{len(received)}/{done['frames']} frames"
    )


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", required=True)
    parser.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto")
    parser.add_argument("--deploy-config")
    parser.add_argument("--stage-overrides")
    parser.add_argument("--engine-arg", action="append", default=[])
    parser.add_argument("--turns", type=int, default=3, help="understanding turns (default 3)")
    parser.add_argument("--max-tokens", type=int, help="thinker max_tokens per turn (default: the deploy's)")
    parser.add_argument("--talker-max-tokens", type=int, help="talker max_tokens per turn (default: the deploy's)")
    parser.add_argument("--size", default="640x384", help="generation size (default 640x384)")
    parser.add_argument("--frames", type=int, default=132, help="generation frames (default 132)")
    parser.add_argument("--steps", type=int, help="generation inference steps (default: the model's)")
    args = parser.parse_args()
    settings = Settings(
        engine="vllm",
        model=args.model,
        device=args.device,
        deploy_config=args.deploy_config,
        stage_overrides=args.stage_overrides,
        engine_arg=args.engine_arg,
    )
    loading = time.monotonic()
    server = TestServer(create_app(settings), host="127.0.0.1", port=0)
    await server.start_server()
    print(f"model loaded in {time.monotonic() - loading:.1f} s; memory {memory()}")
    url = str(server.make_url("")).rstrip("/")
    stages = [{"max_tokens": args.max_tokens} if args.max_tokens else {}]
    if args.talker_max_tokens:
        stages.append({"max_tokens": args.talker_max_tokens})
    config = {"sampling_params_list": stages} if stages != [{}] else {}
    try:
        if server.app[ENGINES].understand is not None:
            await understand(url, args.turns, config)
        else:
            await generate(url, args.size, args.frames, args.steps)
        print(f"memory after: {memory()}")
    finally:
        await server.close()


if __name__ == "__main__":
    asyncio.run(main())
