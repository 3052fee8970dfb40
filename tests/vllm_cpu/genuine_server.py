"""vLLM-Omni 0.30's genuine WebSocket endpoints, served with fake engines (no model, no GPU).

Runs in the vLLM-Omni environment (tests/vllm_cpu/env.sh) so that tests/test_bridge_genuine.py can
put `rtc-omni serve --engine remote` in front of vLLM-Omni's own route functions and handler
classes (`/v1/video/chat/stream`, `/v1/realtime/video`). Only the engine is fake, and honest: its
answers say what the prompt held (frames, audio, history, query), its frames are one solid colour
named by the prompt. `GET /test/record` returns what the engine was asked and which requests were
aborted, so tests can check what the bridge forwarded.

    python tests/vllm_cpu/genuine_server.py --port 0 --kind understand [--model NAME] [--no-streaming]

`--kind realtime` serves the duplex `/v1/realtime` (and `/v1/duplex`): vLLM-Omni's own handler and
Qwen3-Omni duplex session stack, with the model faked (tests/vllm_cpu/fake_duplex.py); its record
is the duplex one. `--no-duplex` serves the route without a duplex deployment (its refusals).

`--kind both` serves both endpoints from one process (importing vLLM costs ~15 s of CPU per start),
with a second, non-streaming generation endpoint under the prefix `/whole`.

It prints `listening on PORT` once it accepts connections, and binds 127.0.0.1 only.
"""

from __future__ import annotations

import argparse
import asyncio
import math
import os
import socket
import sys
from typing import Any

os.environ["HF_HUB_OFFLINE"] = "1"  # nothing here may reach the Hub

import numpy as np  # noqa: E402
import torch  # noqa: E402
import uvicorn  # noqa: E402
from fake_duplex import RECORD as DUPLEX_RECORD  # noqa: E402
from fake_duplex import Pace, create_duplex_handler  # noqa: E402
from fastapi import FastAPI  # noqa: E402
from vllm import SamplingParams  # noqa: E402
from vllm.outputs import CompletionOutput  # noqa: E402
from vllm_omni.entrypoints.openai.api_server import (  # noqa: E402
    duplex_websocket,
    realtime_websocket,
    streaming_video_chat,
    streaming_video_output,
)
from vllm_omni.entrypoints.openai.serving_video_output_stream import OmniStreamingVideoOutputHandler  # noqa: E402
from vllm_omni.entrypoints.openai.serving_video_stream import create_streaming_video_handler  # noqa: E402
from vllm_omni.inputs.data import OmniDiffusionSamplingParams  # noqa: E402
from vllm_omni.outputs import OmniRequestOutput  # noqa: E402
from vllm_omni.outputs.mm_outputs import MultimodalCompletionOutput, MultimodalPayload  # noqa: E402

TALKER_RATE = 24_000
CHUNK_FRAMES = 8
SLOW_PAUSE_S = 30.0
COLOURS = {"red": (220, 30, 30), "green": (30, 200, 30), "blue": (30, 30, 220)}
WHOLE_PREFIX = "/whole"  # --kind both: the non-streaming generation endpoint's path prefix
RECORD: dict[str, list[Any]] = {"requests": [], "aborts": [], "interactions": []}


def _text_of(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(p.get("text", "") for p in content if isinstance(p, dict) and p.get("type") == "text")
    return ""


class FakeChat:
    """The chat service the understanding handler preprocesses with: it keeps the messages as the
    engine prompt, and turns per-stage dicts into vLLM's SamplingParams as vLLM-Omni does."""

    renderer = None
    chat_template = None
    chat_template_content_format = "auto"

    def _to_sampling_params_list(self, per_stage: list[dict[str, Any]]) -> list[Any]:
        return [SamplingParams(**params) for params in per_stage]

    async def _preprocess_chat(self, request: Any, messages: list[dict[str, Any]], **_: Any) -> Any:
        user = messages[-1]["content"]
        prompt = {
            "model": request.model,
            "mm_processor_kwargs": request.mm_processor_kwargs,
            "images": sum(1 for p in user if p.get("type") in ("image_pil", "image_url")),
            "audio": any(p.get("type") == "input_audio" for p in user),
            "query": _text_of(user),
            "system": [m["content"] for m in messages if m["role"] == "system"],
            "history": [_text_of(m["content"]) for m in messages[:-1] if m["role"] != "system"],
        }
        return messages, [prompt]


def _text_output(text: str) -> OmniRequestOutput:
    completion = CompletionOutput(index=0, text=text, token_ids=[1], cumulative_logprob=None, logprobs=None)
    return OmniRequestOutput(request_id="r", final_output_type="text", outputs=[completion], finished=False)


def _audio_output(seconds: float, start: int) -> OmniRequestOutput:
    t = (np.arange(int(seconds * TALKER_RATE)) + start) / TALKER_RATE
    tone = torch.tensor(0.3 * np.sin(2 * math.pi * 440.0 * t), dtype=torch.float32).reshape(1, -1)
    completion = MultimodalCompletionOutput(
        multimodal_output=MultimodalPayload.from_dict({"audio": tone}),
        index=0,
        text="",
        token_ids=[],
        cumulative_logprob=None,
        logprobs=None,
    )
    return OmniRequestOutput(request_id="r", final_output_type="audio", outputs=[completion], finished=False)


class FakeThinkerTalker:
    """AsyncOmni for a Qwen-Omni pipeline: DELTA text, then talker audio. A query containing "slow"
    pauses after its first word. Like AsyncOmni, a cancelled generate() aborts its request."""

    async def generate(self, *, prompt: dict[str, Any], request_id: str, output_modalities: list[str], **kwargs: Any):
        params = kwargs.get("sampling_params_list")
        RECORD["requests"].append(
            {
                "request_id": request_id,
                **prompt,
                "output_modalities": output_modalities,
                "sampling_params_list": None
                if params is None
                else [{"temperature": p.temperature, "max_tokens": p.max_tokens} for p in params],
            }
        )
        answer = (
            f"Turn {len(RECORD['requests'])}: {prompt['images']} frames, audio {'yes' if prompt['audio'] else 'no'}, "
            f"you asked: {prompt['query']}."
        )
        slow = "slow" in prompt["query"]
        try:
            for index, word in enumerate(answer.split(" ")):
                if slow and index == 1:
                    await asyncio.sleep(SLOW_PAUSE_S)  # thinking hard, with no output to send
                yield _text_output(word + " ")
            if "audio" in output_modalities:
                for index in range(3):
                    yield _audio_output(0.4, index * int(0.4 * TALKER_RATE))
        except (asyncio.CancelledError, GeneratorExit):
            RECORD["aborts"].append(request_id)
            raise

    async def abort(self, request_id: Any) -> None:
        RECORD["aborts"].append(request_id)


class FakeDiffusion:
    """AsyncOmni for a video diffusion model: solid frames in the prompt's colour, in chunks with
    vLLM-Omni's stream metadata (or, without streaming output, one output and no metadata)."""

    stage_configs = [{"stage_type": "diffusion", "final_output": True, "final_output_type": "video"}]

    def __init__(self, streaming: bool) -> None:
        self.streaming = streaming
        self.default_sampling_params_list = [OmniDiffusionSamplingParams(num_inference_steps=2)]
        self.prompts: dict[str, str] = {}
        self.pending: dict[str, list[Any]] = {}

    async def generate(self, *, prompt: dict[str, Any], request_id: str, sampling_params_list: list[Any], **_: Any):
        params = sampling_params_list[0]
        num_frames = int(getattr(params, "num_frames", None) or 16)
        height = int(getattr(params, "height", None) or 64)
        width = int(getattr(params, "width", None) or 64)
        self.prompts[request_id] = prompt["prompt"]
        self.pending[request_id] = []
        RECORD["requests"].append({"request_id": request_id, "prompt": prompt["prompt"], "num_frames": num_frames})
        chunks = math.ceil(num_frames / CHUNK_FRAMES) if self.streaming else 1
        active: list[str] = []
        try:
            for index in range(chunks):
                await asyncio.sleep(0.15)
                started, self.pending[request_id] = self.pending[request_id], []
                completed = list(active)
                for interaction in started:
                    self.prompts[request_id] = interaction["prompt"]
                colour = next((c for name, c in COLOURS.items() if name in self.prompts[request_id]), (128,) * 3)
                count = CHUNK_FRAMES if self.streaming else num_frames
                frames = np.empty((min(count, num_frames - index * CHUNK_FRAMES), height, width, 3), np.uint8)
                frames[:] = colour
                stream = {
                    "generation_chunk_index": index,
                    "started_event_ids": [i["event_id"] for i in started],
                    "active_event_ids": [i["event_id"] for i in started],
                    "completed_event_ids": completed,
                }
                active = [i["event_id"] for i in started]
                yield OmniRequestOutput.from_diffusion(
                    request_id=request_id,
                    images=[frames],
                    multimodal_output={"metadata": {"stream": stream}} if self.streaming else {},
                    final_output_type="video",
                    finished=index == chunks - 1,
                )
        except (asyncio.CancelledError, GeneratorExit):
            RECORD["aborts"].append(request_id)
            raise

    async def submit_interaction_async(self, request_id: str, *, interaction: Any) -> None:
        change = {"event_id": interaction["event_id"], "prompt": interaction["event"].get("prompt", "")}
        RECORD["interactions"].append({"request_id": request_id, **change})
        self.pending.setdefault(request_id, []).append(change)

    async def abort(self, request_id: Any) -> None:
        RECORD["aborts"].append(request_id)


def build_app(kinds: tuple[str, ...], model: str | None, streaming: bool) -> FastAPI:
    app = FastAPI()
    app.add_api_websocket_route("/v1/video/chat/stream", streaming_video_chat)
    app.add_api_websocket_route("/v1/realtime/video", streaming_video_output)
    app.add_api_websocket_route("/v1/realtime", realtime_websocket)
    app.add_api_websocket_route("/v1/duplex", duplex_websocket)
    app.state.openai_serving_duplex = None
    if "understand" in kinds:
        app.state.openai_streaming_video = create_streaming_video_handler(FakeChat(), engine_client=FakeThinkerTalker())
    if "generate" in kinds:
        engine = FakeDiffusion(streaming)
        app.state.openai_streaming_video_output = OmniStreamingVideoOutputHandler(
            engine, model_name=model, stage_configs=engine.stage_configs
        )

    @app.get("/health")
    async def health() -> dict[str, str]:
        return {}

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        return {"object": "list", "data": [{"id": model or "default", "object": "model"}]}

    @app.get("/test/record")
    async def record() -> dict[str, list[Any]]:
        return DUPLEX_RECORD if "realtime" in kinds else RECORD

    return app


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--kind", choices=("understand", "generate", "both", "realtime"), required=True)
    parser.add_argument("--model", default=None)
    parser.add_argument("--no-streaming", action="store_true", help="generation: one output, no chunk index")
    parser.add_argument("--no-duplex", action="store_true", help="realtime: no duplex deployment")
    parser.add_argument("--first-audio-delay", type=float, default=Pace.first_audio_delay_s, help="realtime: seconds")
    parser.add_argument("--chunk-interval", type=float, default=Pace.chunk_interval_s, help="realtime: seconds")
    parser.add_argument("--seconds-per-char", type=float, default=Pace.seconds_per_char, help="realtime: speech")
    parser.add_argument("--max-sessions", type=int, default=None, help="realtime: the deploy file's is 1")
    args = parser.parse_args()
    sock = socket.socket()
    sock.bind(("127.0.0.1", args.port))
    sock.listen(128)  # connections wait in the backlog until uvicorn accepts them
    if args.kind == "both":
        app = build_app(("understand", "generate"), args.model, streaming=True)
        app.mount(WHOLE_PREFIX, build_app(("generate",), args.model, streaming=False))
    else:
        app = build_app((args.kind,), args.model, streaming=not args.no_streaming)
    if args.kind == "realtime" and not args.no_duplex:
        pace = Pace(args.first_audio_delay, args.chunk_interval, args.seconds_per_char)
        app.state.openai_serving_duplex = create_duplex_handler(args.model or "default", pace, args.max_sessions)
    # A duplex session kept for resume holds its socket task: do not wait on it for ever.
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", timeout_graceful_shutdown=3))
    print(f"listening on {sock.getsockname()[1]}", flush=True)
    sys.stdout.flush()
    server.run(sockets=[sock])


if __name__ == "__main__":
    main()
