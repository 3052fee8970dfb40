"""Fakes of vLLM-Omni 0.30's object shapes, for driving the vllm engines on CPU.

What the engines read, as vLLM-Omni 0.30 produces it (tests/test_vllm_contract.py checks the same
engines against the real classes where the package is installed):
- AsyncOmni streams every stage as DELTA outputs. A text output's `outputs[0].text` is only the new
  text; an audio output's `outputs[0].multimodal_output["audio"]` is only the new audio, one tensor
  or a list of per-step tensors. `multimodal_output` is a Mapping that is not a dict
  (MultimodalPayload).
- Diffusion outputs carry `images` or a `multimodal_output` dict with "video", and a streaming
  model adds `metadata.stream` with its chunk index and the interactions that started, were
  active and completed in that chunk.
- Failures come back as an output with `error` set.
Tensors have `.float().detach().cpu().numpy()`; abort, interaction and parameter calls are recorded.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Iterator, Mapping
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import numpy as np

from rtc_omni.engines.engine import FunctionTool

# A tool and one exchange with it, as a session hands them to the engine: the question, the call
# the model answered with, and the tool's result.
WEATHER = FunctionTool(
    "get_weather",
    "The weather in a city.",
    {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
)
TOOL_HISTORY: list[dict[str, Any]] = [
    {"role": "user", "content": "Weather in Paris?"},
    {
        "role": "assistant",
        "content": "",
        "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}
        ],
    },
    {"role": "tool", "tool_call_id": "call_1", "content": "22C"},
]


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


class FakePayload(Mapping[str, Any]):
    """MultimodalPayload: a read-only Mapping over tensors, deliberately not a dict."""

    def __init__(self, **tensors: Any) -> None:
        self._tensors = tensors

    def __getitem__(self, key: str) -> Any:
        return self._tensors[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._tensors)

    def __len__(self) -> int:
        return len(self._tensors)


@dataclass
class FakeOutput:
    """OmniRequestOutput's shape (it inherits vLLM's RequestOutput)."""

    request_id: str
    final_output_type: str
    outputs: list[Any]
    finished: bool = False
    error: str | None = None
    images: Any = None
    prompt_token_ids: list[int] | None = None


def text_output(request_id: str, delta: str, prompt_token_ids: list[int] | None = None) -> FakeOutput:
    """One new token of text; the thinker's outputs name the prompt's token ids."""
    completion = SimpleNamespace(text=delta, token_ids=[0], multimodal_output=None)
    return FakeOutput(request_id, "text", [completion], prompt_token_ids=prompt_token_ids)


def audio_output(request_id: str, audio: Any) -> FakeOutput:
    return FakeOutput(request_id, "audio", [SimpleNamespace(text="", multimodal_output=FakePayload(audio=audio))])


def ramp(start: int, count: int) -> np.ndarray:
    """Audio whose every sample names its position: sample i is i / 1e6 (well inside [-1, 1])."""
    return (np.arange(start, start + count, dtype=np.float64) / 1e6).astype(np.float32).reshape(1, -1)


@dataclass
class FakeOmni:
    """AsyncOmni for understanding. Text comes word by word as deltas. Audio comes as groups of
    talker steps: a group of one step is a single tensor, a larger group a list of per-step tensors."""

    words: list[str]
    audio_groups: list[list[int]]  # samples per talker step, grouped as the outputs carry them
    # Instead of words and groups: the outputs in order, a str a text delta as it is, a list an audio group.
    script: list[str | list[int]] | None = None
    step_delay: float = 0.01
    calls: list[tuple[str, str, float]] = field(default_factory=list)  # (what, request_id, time)
    generate_kwargs: list[dict[str, Any]] = field(default_factory=list)
    fail_with: str | None = None
    # The next turn kills this stage for good, as Qwen2.5-Omni's talker dies on sampling parameters
    # without repetition_penalty: the turn fails, and so does every later one and check_health().
    kills_stage: int | None = None
    dead_stage: int | None = None

    async def check_health(self) -> None:
        if self.dead_stage is not None:
            # vLLM-Omni's OmniEngineDeadError: vLLM's generic message, then what is dead.
            raise RuntimeError("EngineCore encountered an issue.", f"Stage-{self.dead_stage} has no live replica")

    async def generate(self, **kwargs: Any) -> AsyncIterator[FakeOutput]:
        request_id = kwargs["request_id"]
        self.calls.append(("generate", request_id, time.monotonic()))
        self.generate_kwargs.append(kwargs)
        if self.kills_stage is not None or self.dead_stage is not None:
            self.dead_stage = self.kills_stage if self.dead_stage is None else self.dead_stage
            await asyncio.sleep(self.step_delay)
            raise RuntimeError("EngineCore encountered an issue. See stack trace (above) for the root cause.")
        position = 0
        # Text first, then audio interleaved with the rest of the text, like async chunking.
        deltas = [word if i == 0 else f" {word}" for i, word in enumerate(self.words)]
        events: list[tuple[str, Any]] = [("text", d) for d in deltas[:3]]
        rest = [("text", d) for d in deltas[3:]]
        for group in self.audio_groups:
            events.append(("audio", group))
            if rest:
                events.append(rest.pop(0))
        events.extend(rest)
        if self.script is not None:
            events = [("text", item) if isinstance(item, str) else ("audio", item) for item in self.script]
        for kind, value in events:
            await asyncio.sleep(self.step_delay)
            if ("abort", request_id) in [(what, rid) for what, rid, _ in self.calls]:
                return  # AsyncOmni ends an aborted request's stream
            if self.fail_with:
                yield FakeOutput(request_id, "text", [], error=self.fail_with)
                return
            if kind == "text":
                yield text_output(request_id, value, kwargs["prompt"].get("prompt_token_ids"))
                continue
            tensors = []
            for steps in value:
                tensors.append(FakeTensor(ramp(position, steps)))
                position += steps
            yield audio_output(request_id, tensors[0] if len(tensors) == 1 else tensors)

    async def abort(self, request_id: str) -> None:
        self.calls.append(("abort", request_id, time.monotonic()))


@dataclass
class FakeSamplingParams:
    """vLLM's SamplingParams as the chat service builds it from a dict, streaming."""

    values: dict[str, Any]
    output_kind: str = "DELTA"


class FakeChat:
    """The chat service: keeps every chat request; turns per-stage dicts into parameter objects."""

    def __init__(self, stage_defaults: list[dict[str, Any]] | None = None, renders_tools: bool = True) -> None:
        self.requests: list[dict[str, Any]] = []
        self.defaults = stage_defaults or []
        self.renders_tools = renders_tools  # Qwen3-Omni's template does; Qwen2.5-Omni's does not

    def stage_defaults(self) -> list[dict[str, Any]]:
        return self.defaults

    async def engine_prompt(self, request: dict[str, Any]) -> dict[str, Any]:
        self.requests.append(request)
        return {"prompt_token_ids": [1, 2, 3]}

    def sampling_params(self, per_stage: list[dict[str, Any]]) -> list[Any]:
        for values in per_stage:
            known = {"temperature", "top_k", "top_p", "max_tokens", "repetition_penalty"}
            known |= {"structured_outputs", "skip_special_tokens"}
            unknown = set(values) - known
            if unknown:
                raise TypeError(f"SamplingParams got unexpected keyword arguments {sorted(unknown)}")
        return [FakeSamplingParams(dict(values)) for values in per_stage]


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
    video_output: bool = True
    built: list[Any] = field(default_factory=list)

    def default_params(self) -> FakeDiffusionParams:
        return FakeDiffusionParams()

    def stage_params(self, diffusion_params: Any) -> list[Any]:
        self.built.append(diffusion_params)
        return [diffusion_params]

    def lora(self, lora: dict[str, Any]) -> tuple[Any, float | None]:
        return f"lora:{lora.get('name')}", lora.get("scale")

    def interaction(self, event_id: str, prompt: str, transition_chunks: int) -> dict[str, Any]:
        return {"event_id": event_id, "event": {"prompt": prompt}, "transition_chunks": transition_chunks}


@dataclass
class _PromptEvent:
    event_id: str
    transition_chunks: int
    elapsed: int = 0


@dataclass
class FakeDiffusionOmni:
    """AsyncOmni for a streaming diffusion model: one output per chunk, frames in a chosen shape.

    With `streaming`, each output reports its chunk the way vLLM-Omni's prompt interactions do:
    an interaction submitted while a chunk is being made starts `late_by` chunks later (2, as
    vLLM-Omni 0.30's Helios reports it: submitted after chunk 0 was delivered, started in chunk 3),
    is active for `transition_chunks` chunks (one when 0) and completes in the last of them.
    """

    chunks: int
    chunk_frames: int
    shape: str = "float_signed_5d"
    delay: float = 0.05
    streaming: bool = False
    late_by: int = 2
    calls: list[tuple[str, Any]] = field(default_factory=list)
    reports: list[dict[str, Any]] = field(default_factory=list)
    _pending: list[tuple[int, _PromptEvent]] = field(default_factory=list)
    _making: int = 0

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

    def _boundary(self, chunk: int, active: list[_PromptEvent]) -> dict[str, Any]:
        """The stream report of `chunk`: advance running transitions, start the due ones."""
        started, running, completed = [], [], []
        for event in list(active):
            event.elapsed += 1
            running.append(event.event_id)
        for due, event in [p for p in self._pending if p[0] == chunk]:
            self._pending.remove((due, event))
            event.elapsed = 1
            active.append(event)
            started.append(event.event_id)
            running.append(event.event_id)
        for event in list(active):
            if event.elapsed >= max(event.transition_chunks, 1):
                active.remove(event)
                completed.append(event.event_id)
        report = {
            "generation_chunk_index": chunk,
            "started_event_ids": started,
            "active_event_ids": running,
            "completed_event_ids": completed,
        }
        self.reports.append(report)
        return report

    async def generate(self, **kwargs: Any) -> AsyncIterator[Any]:
        self.calls.append(("generate", kwargs))
        params = kwargs["sampling_params_list"][0]
        active: list[_PromptEvent] = []
        for chunk in range(self.chunks):
            self._making = chunk
            report = self._boundary(chunk, active)
            await asyncio.sleep(self.delay)
            frames = self._frames(chunk * self.chunk_frames, params.width, params.height)
            mm: dict[str, Any] = {"metadata": {"stream": report}} if self.streaming else {}
            if self.shape == "list_of_frames":
                yield SimpleNamespace(images=[], multimodal_output={**mm, "video": frames}, error=None)
            else:
                yield SimpleNamespace(images=[frames], multimodal_output=mm, error=None)

    async def abort(self, request_id: str) -> None:
        self.calls.append(("abort", request_id))

    async def submit_interaction_async(self, request_id: str, *, interaction: Any) -> None:
        self.calls.append(("interaction", interaction))
        event = _PromptEvent(interaction["event_id"], interaction.get("transition_chunks", 3))
        self._pending.append((self._making + self.late_by, event))
