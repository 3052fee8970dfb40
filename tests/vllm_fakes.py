"""Fakes of vLLM-Omni's object shapes (protocol section 3.7), for driving the vllm engines on CPU.

They reproduce what the engines read: OmniRequestOutput with `final_output_type`, `outputs[0]`
carrying cumulative `text` or `multimodal_output["audio"]` (one tensor first, then a growing list
of per-step tensors), diffusion outputs with `images` or `multimodal_output["video"]`, `error`;
tensors with `.float().detach().cpu().numpy()`; and they record abort and interaction calls.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import numpy as np


class FakeTensor:
    """A GPU tensor stand-in that counts how often it was copied to the CPU."""

    copies = 0

    def __init__(self, values: np.ndarray) -> None:
        self.values = values

    def float(self) -> FakeTensor:
        return FakeTensor(self.values.astype(np.float32))

    def detach(self) -> FakeTensor:
        return self

    def cpu(self) -> FakeTensor:
        FakeTensor.copies += 1
        return self

    def numpy(self) -> np.ndarray:
        return self.values


@dataclass
class FakeOutput:
    """OmniRequestOutput's shape (since it inherits vLLM's RequestOutput)."""

    request_id: str
    final_output_type: str
    outputs: list[Any]
    finished: bool = False
    error: str | None = None
    images: Any = None


def text_output(request_id: str, cumulative: str) -> FakeOutput:
    return FakeOutput(request_id, "text", [SimpleNamespace(text=cumulative, multimodal_output=None)])


def audio_output(request_id: str, audio: Any) -> FakeOutput:
    return FakeOutput(request_id, "audio", [SimpleNamespace(text="", multimodal_output={"audio": audio})])


def ramp(start: int, count: int) -> np.ndarray:
    """Audio whose every sample names its position: sample i is i / 1e6 (well inside [-1, 1])."""
    return (np.arange(start, start + count, dtype=np.float64) / 1e6).astype(np.float32).reshape(1, -1)


@dataclass
class FakeOmni:
    """AsyncOmni for understanding: text grows word by word, audio steps append tensors."""

    words: list[str]
    audio_steps: list[int]  # samples per talker step; the first output carries one tensor
    step_delay: float = 0.01
    calls: list[tuple[str, str, float]] = field(default_factory=list)  # (what, request_id, time)
    generate_kwargs: list[dict[str, Any]] = field(default_factory=list)
    fail_with: str | None = None

    async def generate(self, **kwargs: Any) -> AsyncIterator[FakeOutput]:
        request_id = kwargs["request_id"]
        self.calls.append(("generate", request_id, time.monotonic()))
        self.generate_kwargs.append(kwargs)
        text = ""
        tensors: list[FakeTensor] = []
        position = 0
        # Text first, then audio interleaved with the rest of the text, like async chunking.
        events: list[tuple[str, Any]] = [("text", w) for w in self.words[:3]]
        rest = [("text", w) for w in self.words[3:]]
        for steps in self.audio_steps:
            events.append(("audio", steps))
            if rest:
                events.append(rest.pop(0))
        events.extend(rest)
        for kind, value in events:
            await asyncio.sleep(self.step_delay)
            if self.fail_with:
                yield FakeOutput(request_id, "text", [], error=self.fail_with)
                return
            if kind == "text":
                text = f"{text} {value}".strip()
                yield text_output(request_id, text)
            else:
                tensors.append(FakeTensor(ramp(position, value)))
                position += value
                yield audio_output(request_id, tensors[0] if len(tensors) == 1 else list(tensors))

    async def abort(self, request_id: str) -> None:
        self.calls.append(("abort", request_id, time.monotonic()))


@dataclass
class FakeDiffusionParams:
    """OmniDiffusionSamplingParams' fields that the engine sets."""

    width: int | None = None
    height: int | None = None
    num_frames: int | None = None
    fps: int | None = None
    frame_rate: float | None = None
    num_inference_steps: int = 50
    guidance_scale: float = 5.0
    seed: int | None = None
    extra_args: dict[str, Any] = field(default_factory=dict)
    lora_request: Any = None
    lora_scale: float | None = None


@dataclass
class FakeDiffusionRuntime:
    stage_types: list[str] = field(default_factory=lambda: ["diffusion"])
    built: list[Any] = field(default_factory=list)

    def default_params(self) -> FakeDiffusionParams:
        return FakeDiffusionParams()

    def stage_params(self, diffusion_params: Any) -> list[Any]:
        self.built.append(diffusion_params)
        return [diffusion_params]

    def lora(self, lora: dict[str, Any]) -> tuple[Any, float | None]:
        return f"lora:{lora.get('name')}", lora.get("scale")

    def interaction(self, prompt: str, transition_chunks: int) -> Any:
        return {"event": {"prompt": prompt}, "transition_chunks": transition_chunks}


@dataclass
class FakeDiffusionOmni:
    """AsyncOmni for a streaming diffusion model: one output per chunk, frames in a chosen shape."""

    chunks: int
    chunk_frames: int
    shape: str = "float_signed_5d"
    delay: float = 0.05
    calls: list[tuple[str, Any]] = field(default_factory=list)

    def _frames(self, first: int, width: int, height: int) -> Any:
        from rtc_omni.media import blockcode

        frames = np.zeros((self.chunk_frames, height, width, 3), dtype=np.uint8)
        for i in range(self.chunk_frames):
            frames[i, :, :] = (200, 40, 40)
            blockcode.stamp(frames[i], first + i)
        if self.shape == "float_signed_5d":  # (B, F, H, W, C) in [-1, 1]
            return (frames.astype(np.float32) / 127.5 - 1.0)[None]
        if self.shape == "float_unit_5d":  # diffusers' postprocess_video(output_type="np")
            return (frames.astype(np.float32) / 255.0)[None]
        if self.shape == "list_of_frames":
            return list(frames)
        raise ValueError(self.shape)

    async def generate(self, **kwargs: Any) -> AsyncIterator[Any]:
        self.calls.append(("generate", kwargs))
        params = kwargs["sampling_params_list"][0]
        for chunk in range(self.chunks):
            await asyncio.sleep(self.delay)
            frames = self._frames(chunk * self.chunk_frames, params.width, params.height)
            if self.shape == "list_of_frames":
                yield SimpleNamespace(images=None, multimodal_output={"video": frames}, error=None)
            else:
                yield SimpleNamespace(images=[frames], error=None)

    async def abort(self, request_id: str) -> None:
        self.calls.append(("abort", request_id))

    async def submit_interaction_async(self, request_id: str, *, interaction: Any) -> None:
        self.calls.append(("interaction", interaction))
