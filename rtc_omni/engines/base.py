"""What a model engine is to a session: turns in, streamed text and talker audio out.

Engines know nothing about WebRTC: they get numpy frames and PCM, and yield typed outputs.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

INPUT_SAMPLE_RATE = 16_000  # the microphone audio a turn carries: what vLLM-Omni's `audio.chunk` holds
TALKER_SAMPLE_RATE = 24_000  # the speech an engine yields


class EngineError(Exception):
    """An engine failure whose message is fit for the client (e.g. a remote upstream went away);
    sessions pass it on as the `detail` of their error event."""


@dataclass(frozen=True)
class TurnFrame:
    """One sampled camera frame as the model sees it."""

    rgb: np.ndarray  # (H, W, 3) uint8
    frame_id: str | None
    pts_ms: float | None
    jpeg: bytes | None = None  # the encoded frame as buffered (its md5 names it for caches)


@dataclass(frozen=True)
class UnderstandTurn:
    """Everything one answer is computed from."""

    request_id: str
    frames: list[TurnFrame]
    audio_pcm16: bytes  # INPUT_SAMPLE_RATE mono signed 16-bit little-endian
    query: str
    history: list[dict[str, Any]] = field(default_factory=list)
    system_prompt: str | None = None
    modalities: tuple[str, ...] = ("text", "audio")
    speech_ms: float | None = None  # set when server VAD cut the audio: the speech without padding
    model: str | None = None
    use_audio_in_video: bool = True
    sampling_params_list: list[dict[str, Any]] | None = None  # per stage: thinker, talker, code2wav


@dataclass(frozen=True)
class TextDelta:
    text: str


@dataclass(frozen=True)
class AudioChunk:
    samples: np.ndarray  # float32 mono in [-1, 1] at TALKER_SAMPLE_RATE


UnderstandOutput = TextDelta | AudioChunk


class UnderstandEngine(Protocol):
    """An engine that answers questions about camera frames and microphone audio."""

    name: str

    def generate(self, turn: UnderstandTurn) -> AsyncIterator[UnderstandOutput]:
        """Stream the answer; text deltas and audio chunks may interleave."""
        ...

    async def abort(self, request_id: str) -> None:
        """Stop a request that has not finished; never called for a finished one."""
        ...

    async def close(self) -> None:
        """Release engine resources at server shutdown."""
        ...


@dataclass(frozen=True)
class GenerateRequest:
    """One video generation, with vLLM-Omni's parameters already resolved."""

    request_id: str
    prompt: str
    width: int
    height: int
    num_frames: int
    fps: int
    negative_prompt: str | None = None
    seed: int | None = None
    num_inference_steps: int | None = None
    guidance_scale: float | None = None
    extra_params: dict[str, Any] = field(default_factory=dict)
    # The sampling fields the client set explicitly (num_inference_steps, guidance_scale,
    # guidance_scale_2, true_cfg_scale, seed, boundary_ratio, flow_shift): only these override
    # the engine's defaults, as in vLLM-Omni.
    sampling_overrides: dict[str, Any] = field(default_factory=dict)
    lora: dict[str, Any] | None = None


@dataclass(frozen=True)
class ChunkEvents:
    """The interactions that started, were active during, and completed with one chunk, as the
    engine that applied them reports it (vLLM-Omni's stream metadata)."""

    started: list[str] = field(default_factory=list)
    active: list[str] = field(default_factory=list)
    completed: list[str] = field(default_factory=list)

    @classmethod
    def from_report(cls, report: Mapping[str, Any]) -> ChunkEvents:
        """From vLLM-Omni's `*_event_ids` lists (its stream metadata, or a `video.chunk_metadata`)."""
        return cls(
            started=list(report.get("started_event_ids") or []),
            active=list(report.get("active_event_ids") or []),
            completed=list(report.get("completed_event_ids") or []),
        )


@dataclass(frozen=True)
class VideoChunk:
    """One engine output: frames in any form media/frames.py normalises, and its chunk index.

    `events` is set by engines that report how their interactions progressed; for the others the
    session derives it from the chunk each interaction was scheduled for."""

    frames: Any
    chunk_index: int
    events: ChunkEvents | None = None


class GenerateEngine(Protocol):
    """An engine that streams generated video chunk by chunk."""

    name: str

    def generate(self, request: GenerateRequest) -> AsyncIterator[VideoChunk]:
        """Yield chunks in order until the requested frames are produced."""
        ...

    async def interact(self, request_id: str, event_id: str, prompt: str, transition_chunks: int = 0) -> int:
        """Change the prompt of a running generation; returns the first chunk index it applies to.

        `event_id` names the change in the engine's own chunk reports (`VideoChunk.events`)."""
        ...

    async def abort(self, request_id: str) -> None: ...

    async def close(self) -> None: ...
