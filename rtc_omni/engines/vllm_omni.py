"""vLLM-Omni engines: AsyncOmni's outputs turned into our text, speech and video chunks.

This module holds the logic and is tested on CPU with fakes of vLLM-Omni's object shapes; it
never imports vllm, vllm-omni or torch. `vllm_runtime.py` builds the real AsyncOmni and the chat
preprocessing on a GPU machine and hands them in.

Written against vLLM-Omni 0.30, whose AsyncOmni streams every stage as DELTA outputs: each text
output carries only the new text and each audio output only the tensors produced since the last
one. Understanding follows its Qwen-Omni handler (prompt shape, the per-stage sampling parameters
of session.config, the 1920-sample leading edge cut from a turn's first audio); generation builds
the diffusion sampling parameters, interactions and chunk reports as its streaming video handler.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import uuid
from collections.abc import AsyncGenerator, AsyncIterator, Mapping
from typing import Any, Protocol

import numpy as np
from PIL import Image

from ..media.wav import wav_base64
from ..pcm import INPUT_SAMPLE_RATE
from ..protocol.validation import error_text
from .engine import (
    AudioChunk,
    ChunkEvents,
    EngineError,
    GenerateRequest,
    TextDelta,
    UnderstandOutput,
    UnderstandTurn,
    Usage,
    VideoChunk,
)
from .tool_calls import (
    CallStream,
    ToolCall,
    call_outputs,
    forced_call,
    forced_schema,
    hermes_messages,
    in_prompt,
    offered,
    openai_tools,
)

logger = logging.getLogger(__name__)

CODEC_FRAME_SAMPLES = 1920  # the talker's causal-convolution leading edge (80 ms at 24 kHz)
HISTORY_MESSAGES = 2  # the Qwen handler replays the last two history entries, as text
ABORT_SETTLE_S = 0.1  # upstream's scheduler needs a moment after an abort before the next request
# Qwen-Omni's audio encoder turns a clip of under ~30 ms into no token at all, and vLLM-Omni then fails
# the whole request ("too short to be represented inside the model"). A turn asked right after another
# carries only the mic audio of the moment between them, so shorter clips are padded with silence.
MIN_MODEL_AUDIO_S = 0.1
TRANSCRIBE_PROMPT = "Transcribe the speech in this audio word for word. Reply with the transcript only."


class OmniClient(Protocol):
    """The part of vLLM-Omni's AsyncOmni the engines use."""

    def generate(self, *args: Any, **kwargs: Any) -> AsyncIterator[Any]: ...

    async def abort(self, request_id: str) -> None: ...


class ChatRuntime(Protocol):
    """vLLM-Omni's chat service, as far as understanding needs it; injected so that tests can fake it."""

    async def engine_prompt(self, request: dict[str, Any]) -> Any:
        """The chat request through the chat template and multimodal loading: one engine prompt."""
        ...

    def sampling_params(self, per_stage: list[dict[str, Any]]) -> list[Any]:
        """session.config's per-stage dicts as the stages' parameter objects, streaming (DELTA)."""
        ...

    def stage_defaults(self) -> list[dict[str, Any]]:
        """The deploy config's default sampling parameters of each stage, as dicts."""
        ...

    @property
    def renders_tools(self) -> bool:
        """Whether the model's chat template renders `tools`, tool calls and tool results."""
        ...


def over_stage_defaults(per_stage: list[dict[str, Any]], defaults: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each stage's session parameters over that stage's deploy defaults.

    vLLM-Omni builds a given stage dict from vLLM's own defaults, not the deploy's. For a talker
    that drops the deploy's repetition_penalty: vLLM then leaves the prompt token ids out of the
    sampling metadata, Qwen2.5-Omni's talker fails on them, and the stage is dead for good."""
    return [{**(defaults[i] if i < len(defaults) else {}), **stage} for i, stage in enumerate(per_stage)]


ENGINE_DOWN = "The model's engine is down ({reason}); the server must be restarted"


async def engine_down(client: Any) -> str | None:
    """Why AsyncOmni can serve nothing more, or None: its `check_health()` raises when the
    orchestrator died or a stage has no live replica left. A dead stage stays dead (a talker that
    crashed on its inputs takes every later turn down with it), so it is health, not one failure."""
    check = getattr(client, "check_health", None)
    if check is None:
        return None
    try:
        result = check()
        if asyncio.iscoroutine(result):
            await result
    except Exception as exc:
        # vLLM-Omni's EngineDeadError carries vLLM's generic message first, the stage's state last.
        return str(exc.args[-1]) if len(exc.args) > 1 else error_text(exc)
    return None


async def raise_if_down(client: Any, cause: BaseException | None = None) -> None:
    """An EngineError that says the engine is down (and why), when it is."""
    if (reason := await engine_down(client)) is not None:
        raise EngineError(ENGINE_DOWN.format(reason=reason)) from cause


async def shut_down(client: Any) -> None:
    """AsyncOmni.shutdown(), sync or async, when the client has one."""
    shutdown = getattr(client, "shutdown", None)
    if callable(shutdown):
        result = shutdown()
        if asyncio.iscoroutine(result):
            await result


# ----------------------------------------------------------------------------- understanding


def text_of(content: Any) -> str:
    """A history message's content reduced to text, as the Qwen handler replays it."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(p.get("text", "") for p in content if isinstance(p, dict) and p.get("type") == "text")
    return ""


def model_audio(pcm16: bytes) -> bytes:
    """16 kHz PCM16 padded with silence to MIN_MODEL_AUDIO_S, so the model has a token for it."""
    shortfall = int(MIN_MODEL_AUDIO_S * INPUT_SAMPLE_RATE) * 2 - len(pcm16)
    return pcm16 + bytes(shortfall) if shortfall > 0 else pcm16


def recent_history(history: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The history the prompt replays: the Qwen handler's last HISTORY_MESSAGES entries, widened so
    that no tool result loses its call and a turn answering tool results keeps the whole exchange
    since the user's request (the model must see what was asked to use what the tools returned)."""
    start = max(0, len(history) - HISTORY_MESSAGES)
    if history and history[-1]["role"] == "tool":
        start = min(start, max((i for i, m in enumerate(history) if m["role"] == "user"), default=0))
    while start > 0 and history[start]["role"] == "tool":
        start -= 1
    return [history_message(past) for past in history[start:]]


def history_message(past: dict[str, Any]) -> dict[str, Any]:
    """A history message as text, as the Qwen handler replays it, with its calls or call id."""
    message = {"role": past["role"], "content": text_of(past.get("content"))}
    for key in ("tool_calls", "tool_call_id"):
        if past.get(key):
            message[key] = past[key]
    return message


def build_messages(turn: UnderstandTurn, renders_tools: bool = True) -> list[dict[str, Any]]:
    """OpenAI-style messages for one turn, in the Qwen-Omni handler's shape. `renders_tools`: the
    chat template renders `tools`, calls and results itself; else they are written out as hermes
    text here (tool_calls.hermes_messages)."""
    messages: list[dict[str, Any]] = []
    if turn.system_prompt:
        messages.append({"role": "system", "content": turn.system_prompt})
    messages += recent_history(turn.history)
    content: list[dict[str, Any]] = []
    for frame in turn.frames:
        # The md5 of the encoded frame is the multimodal uuid: repeated frames hit the engine's cache.
        uuid = hashlib.md5(frame.jpeg, usedforsecurity=False).hexdigest() if frame.jpeg else None
        content.append({"type": "image_pil", "image_pil": Image.fromarray(frame.rgb), "uuid": uuid})
    if turn.audio_pcm16:
        content.append(
            {
                "type": "input_audio",
                "input_audio": {"data": wav_base64(model_audio(turn.audio_pcm16), INPUT_SAMPLE_RATE), "format": "wav"},
            }
        )
    if turn.query:
        content.append({"type": "text", "text": turn.query})
    if content or not messages or messages[-1]["role"] != "tool":  # tool results alone are the input
        messages.append({"role": "user", "content": content})
    if renders_tools:
        return messages
    return hermes_messages(messages, turn.tools if offered(turn.tools, turn.tool_choice) else ())


def chat_request(turn: UnderstandTurn, renders_tools: bool = True) -> dict[str, Any]:
    """The chat-completions request vLLM-Omni's own handler builds, so a model sees the same prompt
    here, with the turn's tools where the chat template renders them."""
    request: dict[str, Any] = {
        "model": turn.model or "default",
        "messages": build_messages(turn, renders_tools),
        "stream": True,
        "modalities": list(turn.modalities),
        "add_generation_prompt": True,
        "continue_final_message": False,
        "add_special_tokens": False,
    }
    if turn.use_audio_in_video and turn.audio_pcm16:
        request["mm_processor_kwargs"] = {"use_audio_in_video": True}
    if renders_tools and offered(turn.tools, turn.tool_choice):
        request["tools"] = openai_tools(turn.tools)
    return request


def first_completion(output: Any) -> Any:
    """outputs[0] of an OmniRequestOutput (which is a vLLM RequestOutput), or None."""
    outputs = getattr(output, "outputs", None)
    return outputs[0] if isinstance(outputs, list) and outputs else None


def to_numpy(tensor: Any) -> np.ndarray:
    """A tensor (or array) as flat float32 on the CPU: `.float().detach().cpu().numpy()` semantics."""
    if hasattr(tensor, "float"):
        value = tensor.float()
        value = value.detach() if hasattr(value, "detach") else value
        return np.asarray(value.cpu().numpy(), dtype=np.float32).reshape(-1)
    return np.asarray(tensor, dtype=np.float32).reshape(-1)


class AudioDrain:
    """Turns the talker's DELTA audio outputs into sample blocks.

    Each output's `multimodal_output["audio"]` holds only what the talker produced since the last
    output: one tensor, or a list of per-step tensors. All of it is new, so each tensor leaves the
    GPU exactly once. The turn's first block loses the codec's leading edge.
    """

    def __init__(self) -> None:
        self.emitted_any = False

    def take(self, audio: Any) -> np.ndarray | None:
        tensors = audio if isinstance(audio, list) else [] if audio is None else [audio]
        if not tensors:
            return None
        samples = np.concatenate([to_numpy(t) for t in tensors])
        if not self.emitted_any and samples.size > 2 * CODEC_FRAME_SAMPLES:
            samples = samples[CODEC_FRAME_SAMPLES:]
        if samples.size == 0:
            return None
        self.emitted_any = True
        return np.clip(samples, -1.0, 1.0)


class TokenCount:
    """A turn's tokens from the thinker's DELTA outputs: the prompt's ids (with its multimodal
    placeholders, as the model saw them) and each output's new token ids."""

    def __init__(self) -> None:
        self.prompt: int | None = None
        self.cached: int | None = None
        self.generated = 0

    def add(self, output: Any, completion: Any) -> None:
        prompt_ids = getattr(output, "prompt_token_ids", None)
        if prompt_ids:
            self.prompt = max(self.prompt or 0, len(prompt_ids))
        if isinstance(cached := getattr(output, "num_cached_tokens", None), int):
            self.cached = cached
        self.generated += len(getattr(completion, "token_ids", None) or ())

    def usage(self) -> Usage | None:
        """None when the outputs never named the prompt: the engine cannot say what the turn took."""
        if self.prompt is None:
            return None
        return Usage(
            input_tokens=self.prompt,
            output_tokens=self.generated,
            input_cached_tokens=self.cached,
            output_text_tokens=self.generated,
        )


class OmniUnderstandEngine:
    """Answers turns with a multi-stage vLLM-Omni model (Qwen3-Omni: thinker, talker, code2wav)."""

    name = "vllm"

    calls_tools = True  # in Qwen's hermes format (tool_calls.py); one call per response

    def __init__(self, client: OmniClient, chat: ChatRuntime) -> None:
        self.client = client
        self.chat = chat

    async def _request(self, turn: UnderstandTurn, forced: dict[str, Any] | None) -> dict[str, Any]:
        """generate()'s arguments, with vLLM-Omni's error strings for what the client got wrong.
        `forced`: the schema the thinker's answer must follow, a call and nothing else, so the
        talker does not run."""
        modalities = ["text"] if forced is not None else list(turn.modalities)
        kwargs: dict[str, Any] = {"request_id": turn.request_id, "output_modalities": modalities}
        thinker: dict[str, Any] = {}  # stage 0
        if forced is not None:
            thinker = {"structured_outputs": {"json": forced}}
        elif offered(turn.tools, turn.tool_choice):
            # As vLLM's hermes parser asks: a tokenizer may mark <tool_call> special (Qwen's does not).
            thinker = {"skip_special_tokens": False}
        try:
            per_stage = [dict(stage) for stage in turn.sampling_params_list or []]
            if thinker:
                per_stage = [{**(per_stage or [{}])[0], **thinker}, *per_stage[1:]]
            if per_stage:
                kwargs["sampling_params_list"] = self.chat.sampling_params(
                    over_stage_defaults(per_stage, self.chat.stage_defaults())
                )
        except Exception as exc:
            raise EngineError(f"Failed to build request: {error_text(exc)}") from exc
        try:
            # Off the loop: chat_request decodes the frames, and the template may need its first look.
            request = await asyncio.to_thread(
                lambda: chat_request(turn, not in_prompt(turn.tools, turn.history) or self.chat.renders_tools)
            )
            kwargs["prompt"] = await self.chat.engine_prompt(request)
        except Exception as exc:
            raise EngineError(f"Preprocess failed: {error_text(exc)}") from exc
        return kwargs

    async def health(self) -> str | None:
        """Why the engine can answer no turn (a dead stage), or None."""
        return await engine_down(self.client)

    async def generate(self, turn: UnderstandTurn) -> AsyncIterator[UnderstandOutput]:
        """The answer; with tools offered, the text up to a `<tool_call>` and then the call.

        After a call the request is aborted once and nothing more is read from it: one call per
        response. Talker audio stops at the marker too; speech of the words just before it, still
        in the talker when the marker came, is lost with it (docs/vllm.md, "Tool calling")."""
        await raise_if_down(self.client)
        forced = forced_schema(turn.tools, turn.tool_choice) if offered(turn.tools, turn.tool_choice) else None
        calls = CallStream(turn.tools) if offered(turn.tools, turn.tool_choice) and forced is None else None
        forced_text: list[str] = []
        audio = AudioDrain()
        tokens = TokenCount()
        call: ToolCall | None = None
        try:
            async for output in self.client.generate(**await self._request(turn, forced)):
                if call is not None:
                    continue  # the abort's last outputs
                if error := getattr(output, "error", None):
                    raise RuntimeError(str(error))
                completion = first_completion(output)
                if completion is None:
                    continue
                if getattr(output, "final_output_type", "text") == "audio":
                    mm = getattr(completion, "multimodal_output", None)
                    samples = audio.take(mm.get("audio") if isinstance(mm, Mapping) else None)
                    if samples is not None and not (calls is not None and calls.calling):
                        yield AudioChunk(samples)
                    continue
                tokens.add(output, completion)
                if not isinstance(text := getattr(completion, "text", None), str) or not text:
                    continue
                if forced is not None:
                    forced_text.append(text)
                    continue
                if calls is not None:
                    text, call = calls.feed(text)
                if text:
                    yield TextDelta(text)
                if call is not None:
                    for item in call_outputs(call):
                        yield item
                    await self.abort(turn.request_id)
        except Exception as exc:
            await raise_if_down(self.client, exc)  # the turn that killed a stage says so too
            raise
        if forced is not None:
            for item in call_outputs(forced_call(turn.tools, turn.tool_choice, "".join(forced_text))):
                yield item
        elif calls is not None and call is None and (rest := calls.end()):
            yield TextDelta(rest)
        if (usage := tokens.usage()) is not None:
            yield usage

    @property
    def transcriber(self) -> OmniUnderstandEngine:
        """Qwen-Omni transcribes: the model itself is this engine's recogniser."""
        return self

    @property
    def transcription_model(self) -> str:
        return self.name

    async def transcribe(self, pcm16: bytes, language: str | None = None) -> AsyncGenerator[str, None]:
        """The audio's transcript as a thinker-only text request (no talker, no history)."""
        prompt = TRANSCRIBE_PROMPT + (f" The language is {language}." if language else "")
        turn = UnderstandTurn(
            request_id=f"transcribe-{uuid.uuid4().hex[:16]}",
            frames=[],
            audio_pcm16=pcm16,
            query=prompt,
            modalities=("text",),
            use_audio_in_video=False,
        )
        finished = False
        try:
            async for output in self.generate(turn):
                if isinstance(output, TextDelta):
                    yield output.text
            finished = True
        finally:
            if not finished:
                await self.abort(turn.request_id)

    async def abort(self, request_id: str) -> None:
        await self.client.abort(request_id)
        await asyncio.sleep(ABORT_SETTLE_S)

    async def close(self) -> None:
        await shut_down(self.client)


# ----------------------------------------------------------------------------- generation


def _multimodal(result: Any) -> Mapping[str, Any]:
    mm = getattr(result, "multimodal_output", None)
    return mm if isinstance(mm, Mapping) else {}


def video_outputs(result: Any) -> Any:
    """The videos of one diffusion output: its `images`, else its multimodal 'video'."""
    images = getattr(result, "images", None)
    return images if images else _multimodal(result).get("video")


def log_interactions(request_id: str, report: Mapping[str, Any]) -> None:
    """Log a chunk report that names interactions, as vLLM-Omni sent it: where a prompt change
    really started and ended, next to the `apply_from_chunk` we announced."""
    if any(report.get(key) for key in ("started_event_ids", "active_event_ids", "completed_event_ids")):
        logger.info("vLLM-Omni chunk report for %s: %s", request_id, json.dumps(dict(report), default=str))


def stream_report(result: Any) -> Mapping[str, Any]:
    """The chunk report a streaming diffusion model attaches: multimodal_output.metadata.stream."""
    metadata = _multimodal(result).get("metadata")
    stream = metadata.get("stream") if isinstance(metadata, Mapping) else None
    return stream if isinstance(stream, Mapping) else {}


class DiffusionRuntime(Protocol):
    """vLLM-Omni's pieces the generation engine needs, injected so that tests can fake them."""

    video_output: bool  # the pipeline ends in a video stage (vLLM-Omni's is_video_generation_pipeline)

    def default_params(self) -> Any:
        """A fresh OmniDiffusionSamplingParams, or a deep copy of the engine's default one."""
        ...

    def stage_params(self, diffusion_params: Any) -> list[Any]:
        """The per-stage sampling list with the diffusion parameters replaced."""
        ...

    def lora(self, lora: dict[str, Any]) -> tuple[Any, float | None]:
        """vLLM-Omni's parse_lora_request."""
        ...

    def interaction(self, event_id: str, prompt: str, transition_chunks: int) -> Any:
        """An OmniInteractionPrompt."""
        ...


def diffusion_params(runtime: DiffusionRuntime, request: GenerateRequest) -> Any:
    """OmniDiffusionSamplingParams as the reference builds them: engine defaults (already a copy),
    then only what the client set explicitly, so an unset field keeps the model's own default."""
    params = runtime.default_params()
    params.width, params.height = request.width, request.height
    params.num_frames = request.num_frames
    params.fps = request.fps
    params.frame_rate = float(request.fps)
    for name, value in request.sampling_overrides.items():
        if name == "flow_shift":
            params.extra_args["flow_shift"] = value
        else:
            setattr(params, name, value)
    params.extra_args.update(request.extra_params)
    if request.lora:
        lora_request, lora_scale = runtime.lora(request.lora)
        if lora_request is not None:
            params.lora_request = lora_request
            if lora_scale is not None:
                params.lora_scale = lora_scale
    return params


def chunk_of(videos: Any, count: int, report: Mapping[str, Any]) -> VideoChunk:
    """A chunk numbered and annotated as the model reported it, or by arrival when it did not."""
    if not report:
        return VideoChunk(frames=videos, chunk_index=count)
    index = report.get("generation_chunk_index")
    return VideoChunk(
        frames=videos, chunk_index=index if isinstance(index, int) else count, events=ChunkEvents.from_report(report)
    )


class OmniGenerateEngine:
    """Streams video from a diffusion-only vLLM-Omni model (Helios streams chunk by chunk)."""

    name = "vllm"

    def __init__(self, client: OmniClient, runtime: DiffusionRuntime) -> None:
        self.client = client
        self.runtime = runtime
        self._chunks_yielded: dict[str, int] = {}

    async def health(self) -> str | None:
        """Why the engine can generate nothing (its diffusion stage died), or None."""
        return await engine_down(self.client)

    async def generate(self, request: GenerateRequest) -> AsyncIterator[VideoChunk]:
        await raise_if_down(self.client)
        if not self.runtime.video_output:
            raise RuntimeError("No final video output stage found in video generation pipeline.")
        prompt: dict[str, Any] = {"prompt": request.prompt}
        if request.negative_prompt is not None:
            prompt["negative_prompt"] = request.negative_prompt
        sampling = self.runtime.stage_params(diffusion_params(self.runtime, request))
        self._chunks_yielded[request.request_id] = 0
        try:
            stream = self.client.generate(prompt=prompt, request_id=request.request_id, sampling_params_list=sampling)
            async for output in stream:
                if error := getattr(output, "error", None):
                    raise RuntimeError(str(error))
                videos = video_outputs(output)
                if videos is None:
                    raise RuntimeError("No video outputs found in generation result.")
                count = self._chunks_yielded[request.request_id]
                self._chunks_yielded[request.request_id] = count + 1
                report = stream_report(output)
                log_interactions(request.request_id, report)
                yield chunk_of(videos, count, report)
        finally:
            self._chunks_yielded.pop(request.request_id, None)

    async def interact(self, request_id: str, event_id: str, prompt: str, transition_chunks: int = 0) -> int:
        if request_id not in self._chunks_yielded:
            raise ValueError(f"no running generation {request_id}")
        submit = getattr(self.client, "submit_interaction_async", None)
        if submit is None:
            raise ValueError("this engine does not take interactions")
        await submit(request_id, interaction=self.runtime.interaction(event_id, prompt, transition_chunks))
        # vLLM-Omni applies a pending interaction after decoding a chunk, when it prepares the next;
        # the chunk after the one in progress is the first it can reach, and its own reports name
        # the one after that (Helios on CPU, docs/vllm.md: queued after chunk 0, started in chunk 3).
        return self._chunks_yielded[request_id] + 2

    async def abort(self, request_id: str) -> None:
        await self.client.abort(request_id)

    async def close(self) -> None:
        await shut_down(self.client)
