"""GPU smoke test of `--engine vllm`: one understanding turn or one short generation, end to end.

On a machine with a CUDA GPU, vLLM-Omni (`pip install -e ".[vllm]"`) and the model's weights:

  python benchmarks/vllm_smoke.py --model Qwen/Qwen3-Omni-30B-A3B-Instruct
  python benchmarks/vllm_smoke.py --model BestWishYsh/Helios-Distilled --engine-arg diffusion-streaming-output

It serves the model in-process on 127.0.0.1, connects a headless aiortc peer (a red camera and a
440 Hz tone, or a prompt), and prints time to first text and first audio, or frames/s, and the GPU
memory the process holds. Further `vllm serve --omni` arguments go through --engine-arg KEY=VALUE
(or a bare KEY for a switch).
"""

from __future__ import annotations

import argparse
import asyncio
import subprocess
import time

from aiohttp.test_utils import TestServer

from rtc_omni.app import create_app
from rtc_omni.client.media import COLOURS, ColourVideoTrack, ToneAudioTrack
from rtc_omni.client.peer import GenerateClient, UnderstandClient
from rtc_omni.config import Settings
from rtc_omni.signaling.keys import ENGINES


def gpu_memory() -> str:
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=memory.used,memory.total", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=10,
        ).stdout.strip()
    except (OSError, subprocess.TimeoutExpired):
        return "unknown (no nvidia-smi)"
    return out.replace("\n", "; ")


async def understand(url: str) -> None:
    client = UnderstandClient(url, video=ColourVideoTrack(COLOURS["red"], 640, 480, 30), audio=ToneAudioTrack(440))
    await client.connect()
    await client.configure()
    await client.wait_event("video.frame.ack")
    await asyncio.sleep(1.0)
    result = await client.ask("What colour do you see, and what do you hear?", timeout=300)
    first_audio = next(
        (f.at for f in client.recorder.frames if f.at > result.sent_at and f.rms >= client.recorder.SILENCE_RMS), None
    )
    print(f"answer: {result.text!r}")
    print(
        f"time to first text {result.time_to_first_text:.3f} s, first audio {first_audio - result.sent_at:.3f} s"
        if first_audio
        else "no audio heard"
    )
    await client.close()


async def generate(url: str, frames: int) -> None:
    client = GenerateClient(url)
    await client.connect()
    started = time.monotonic()
    await client.start(prompt="a red kite over the sea", size="640x384", fps=16, num_frames=frames, timeout=600)
    done = await client.wait_event("session.done", timeout=1800)
    await asyncio.sleep(0.5)
    received = list(client.receiver.frames)
    span = received[-1].at - received[0].at if len(received) > 1 else 0.0
    print(
        f"{len(received)}/{done['frames']} frames; first frame after {received[0].at - started:.2f} s; "
        f"{(len(received) - 1) / span:.2f} frames/s"
        if received
        else "no frames"
    )
    await client.close()


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", required=True)
    parser.add_argument("--deploy-config")
    parser.add_argument("--stage-overrides")
    parser.add_argument("--engine-arg", action="append", default=[])
    parser.add_argument("--frames", type=int, default=132)
    args = parser.parse_args()
    settings = Settings(
        engine="vllm",
        model=args.model,
        deploy_config=args.deploy_config,
        stage_overrides=args.stage_overrides,
        engine_arg=args.engine_arg,
    )
    loading = time.monotonic()
    server = TestServer(create_app(settings), host="127.0.0.1", port=0)
    await server.start_server()
    print(f"model loaded in {time.monotonic() - loading:.1f} s; GPU memory {gpu_memory()}")
    url = str(server.make_url("")).rstrip("/")
    try:
        if server.app[ENGINES].understand is not None:
            await understand(url)
        else:
            await generate(url, args.frames)
        print(f"GPU memory after: {gpu_memory()}")
    finally:
        await server.close()


if __name__ == "__main__":
    asyncio.run(main())
