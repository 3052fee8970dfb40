"""What a model engine is to a session: turns in, streamed text and talker audio out.

Engines know nothing about WebRTC: they get camera frames (`TurnFrame`) and PCM, and yield typed outputs.
"""

from __future__ import annotations

import io
from collections.abc import AsyncGenerator, AsyncIterator, Mapping
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any, Literal, Protocol, runtime_checkable

import numpy as np
from PIL import Image


class EngineError(Exception):
    """An engine failure whose message is fit for the client (e.g. a remote upstream went away);
    sessions pass it on as the `detail` of their error event."""


@dataclass(frozen=True)
class TurnFrame:
    """One sampled camera frame as the model sees it.

    A frame a session buffered comes as its JPEG, checked against --max-image-pixels when it
    arrived, and is decoded only as far as an engine asks: the synthetic engine looks at small
    previews, vLLM-Omni at the whole image, the remote engine sends the JPEG on. Decoding every
    turn's frames whole up front cost more CPU than the rest of a turn. Call these off the event
    loop: they decode.
    """

    frame_id: str | None
    pts_ms: float | None
    jpeg: bytes  # the encoded frame as buffered (its md5 names it for caches)

    @cached_property
    def rgb(self) -> np.ndarray:
        """The whole image, (H, W, 3) uint8."""
        with self._open() as image:
            return np.asarray(image.convert("RGB"))

    @cached_property
    def size(self) -> tuple[int, int]:
        """(width, height), from the JPEG's header."""
        with self._open() as image:
            return image.size

    def preview(self, mode: str, side: int) -> np.ndarray:
        """The image in PIL `mode` ("RGB", "L"), at least `side` pixels a side where the image is: a
        JPEG is decoded at 1/2, 1/4 or 1/8 scale (its DCT scaling), at a fraction of a full decode."""
        with self._open() as image:
            image.draft(mode, (side, side))
            return np.asarray(image.convert(mode))

    def _open(self) -> Image.Image:
        return Image.open(io.BytesIO(self.jpeg))


@dataclass(frozen=True)
class FunctionTool:
    """A function the model may call (the Realtime API's `{type: "function", ...}` tool)."""

    name: str
    description: str
    parameters: dict[str, Any]  # JSON Schema of its arguments object


@dataclass(frozen=True)
class ForcedTool:
    """`tool_choice` naming one tool: the answer is a call of it."""

    name: str


# auto: the model decides; none: it calls nothing; required: it calls one of the tools.
ToolChoice = Literal["auto", "none", "required"] | ForcedTool


@dataclass(frozen=True)
class UnderstandTurn:
    """Everything one answer is computed from.

    `history` is chat-completions messages, oldest first: `{"role", "content"}`, an assistant
    message's calls as `tool_calls` ({"id", "type": "function", "function": {"name", "arguments"}}),
    and a call's result as `{"role": "tool", "tool_call_id", "content"}`, which is how chat
    templates (Qwen's among them) render them. `tools` is empty unless the session offers tools
    and the engine calls them (`ToolCallingEngine`).
    """

    request_id: str
    frames: list[TurnFrame]
    audio_pcm16: bytes  # INPUT_SAMPLE_RATE mono signed 16-bit little-endian
    query: str
    history: list[dict[str, Any]] = field(default_factory=list)
    tools: tuple[FunctionTool, ...] = ()
    tool_choice: ToolChoice = "auto"
    system_prompt: str | None = None
    modalities: tuple[str, ...] = ("text", "audio")
    speech_ms: float | None = None  # set when server VAD cut the audio: the speech without padding
    model: str | None = None
    use_audio_in_video: bool = True
    sampling_params_list: list[dict[str, Any]] | None = None  # per stage: thinker, talker, code2wav
    engine_session: EngineSession | None = None  # set when the engine follows the session live
    # The conversation's item ids, for an engine that mirrors the conversation upstream (the remote
    # engine's /v1/realtime): the item each `history` message starts with, the current input's
    # items, and the id the answer's message will have. An understanding session names its turns'
    # questions and answers.
    history_ids: tuple[str, ...] = ()
    input_ids: tuple[str, ...] = ()
    output_id: str | None = None


@dataclass(frozen=True)
class TextDelta:
    text: str


@dataclass(frozen=True)
class ContextLost:
    """The engine's memory of the conversation so far is gone (a remote upstream failed over or
    was reset by an interrupt); sessions tell the client, since answers may ignore earlier turns."""

    reason: str


@dataclass(frozen=True)
class AudioChunk:
    samples: np.ndarray  # float32 mono in [-1, 1] at TALKER_SAMPLE_RATE


@dataclass(frozen=True)
class Usage:
    """The tokens one answer took, as the engine counted them; yielded once, after its last output.
    A detail the engine does not count is None."""

    input_tokens: int
    output_tokens: int
    input_text_tokens: int | None = None
    input_audio_tokens: int | None = None
    input_image_tokens: int | None = None
    input_cached_tokens: int | None = None
    output_text_tokens: int | None = None
    output_audio_tokens: int | None = None


@dataclass(frozen=True)
class FunctionCallStarted:
    """The model calls a tool of the turn's. Its arguments follow as `FunctionArguments`; the call
    ends where the next one starts or the stream ends. Once a call starts, an engine yields no more
    text or audio: only further calls and its `Usage`."""

    call_id: str
    name: str


@dataclass(frozen=True)
class FunctionArguments:
    """Part of the current call's arguments: the parts joined are its JSON object."""

    call_id: str
    delta: str


UnderstandOutput = TextDelta | AudioChunk | ContextLost | Usage | FunctionCallStarted | FunctionArguments


@dataclass(frozen=True)
class LiveSettings:
    """A session's settings as an engine that follows it live needs them before its first turn."""

    model: str | None
    system_prompt: str | None
    modalities: tuple[str, ...]
    num_frames: int
    max_frames: int
    use_audio_in_video: bool
    sampling_params_list: list[dict[str, Any]] | None
    audio_streamed: bool  # True: every sampled chunk goes to add_audio; False: each turn brings its own
    realtime: bool = False  # an OpenAI Realtime conversation; else an understanding session


class EngineSession(Protocol):
    """An engine's own state for one session, fed media as the session samples it, so the engine
    can keep the conversation between turns (the remote engine's one upstream WebSocket)."""

    def add_frame(self, image: bytes) -> None:
        """A frame the session buffered (encoded JPEG or PNG)."""
        ...

    def add_audio(self, pcm16: bytes) -> None:
        """Microphone audio as the session buffers it (16 kHz mono PCM16)."""
        ...

    async def close(self) -> None: ...


@runtime_checkable
class ConversationMirror(Protocol):
    """Optional, for an engine session: one that mirrors the conversation's items upstream is told
    when an answer is cut to what the user heard (its audio's first `audio_end_ms`, and the words
    kept of its transcript), so the model's memory holds only that."""

    def truncate(self, item_id: str, audio_end_ms: int, transcript: str) -> None: ...


@runtime_checkable
class LiveUnderstandEngine(Protocol):
    """Optional: an understanding engine that wants each session's media as it is sampled. Its turns
    carry the session it opened (`UnderstandTurn.engine_session`); other engines get no calls."""

    def open_session(self, session_id: str, settings: LiveSettings) -> EngineSession: ...


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


@runtime_checkable
class ToolCallingEngine(Protocol):
    """Optional: an understanding engine that calls a turn's `tools`. Sessions offer tools only
    to engines for which `calls_tools` is true; the others get turns without tools."""

    @property
    def calls_tools(self) -> bool: ...


def calls_tools(engine: object) -> bool:
    return isinstance(engine, ToolCallingEngine) and engine.calls_tools


class Transcriber(Protocol):
    """Speech to text for the user's committed audio (the Realtime API's input transcription)."""

    transcription_model: str  # what does the transcribing, for logs and docs

    def transcribe(self, pcm16: bytes, language: str | None = None) -> AsyncGenerator[str, None]:
        """Stream the transcript of INPUT_SAMPLE_RATE mono PCM16 as text deltas; `language` is an
        ISO-639-1 hint. Raises (EngineError for a client-fit message) when it cannot."""
        ...


@runtime_checkable
class TranscribingEngine(Protocol):
    """Optional: an understanding engine that offers input transcription. `transcriber` is None
    when this deployment has none (e.g. the recogniser's extra is not installed)."""

    @property
    def transcriber(self) -> Transcriber | None: ...


def transcriber_of(engine: object) -> Transcriber | None:
    """The engine's transcriber, or None for an engine without the capability."""
    return engine.transcriber if isinstance(engine, TranscribingEngine) else None


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
    model: str | None = None  # the client's model name, for a remote upstream to check


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
