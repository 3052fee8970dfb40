"""vLLM-Omni 0.30's duplex session stack for Qwen3-Omni, with only the model faked.

The websocket handler (`OmniDuplexSessionHandler`), `DuplexOmni`'s session handles, the engine's
`DuplexSessionManager` and its runners, and the Qwen3-Omni duplex plugin (capabilities, PCM
buffering, history and image handling, output projection) are vLLM-Omni's own. Two things stand
in for what needs a model: the chat template (`TemplateProcessor`, the plugin's `processor`,
which renders the conversation as JSON), and the stages (`FakeStages`, in place of
`DuplexOrchestrator`'s stage pools), whose answer says what the prompt held, and whose speech is
a tone whose length follows the text. `FakeEngine` carries the engine's control and command
messages in-process to the manager, where `DuplexOmniEngine` puts them on the orchestrator's
queues. `RECORD` keeps what arrived, with `time.monotonic()` stamps, for `GET /test/record`.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import math
import time
import uuid
from pathlib import Path
from typing import Any

import numpy as np
import torch
import vllm_omni
from vllm import SamplingParams
from vllm.logger import init_logger
from vllm.outputs import CompletionOutput
from vllm_omni.config.stage_config import DuplexSessionRuntimeConfig, load_deploy_config
from vllm_omni.engine.duplex import commands
from vllm_omni.engine.duplex.config import DuplexCapabilities, DuplexSessionConfig
from vllm_omni.engine.duplex.contracts import (
    DuplexOutputContext,
    DuplexRequestIdentity,
    DuplexStagePort,
    DuplexStageRequestContext,
    DuplexStageSubmission,
    DuplexStageSubmissionResult,
)
from vllm_omni.engine.duplex.messages import (
    CloseDuplexSessionMessage,
    DuplexControlResultMessage,
    DuplexSessionCommandMessage,
    DuplexSessionError,
    DuplexSessionEventMessage,
    OpenDuplexSessionMessage,
    ResumeDuplexSessionMessage,
    TouchDuplexSessionMessage,
)
from vllm_omni.engine.duplex.plugin import DuplexModelPlugin, load_duplex_plugin
from vllm_omni.engine.duplex.session.manager import DuplexSessionManager
from vllm_omni.entrypoints.duplex.audio_encoding import encode_audio
from vllm_omni.entrypoints.duplex.serving import OmniDuplexSessionHandler
from vllm_omni.entrypoints.duplex_omni import DuplexOmni
from vllm_omni.model_executor.models.qwen3_omni.pipeline import QWEN3_OMNI_PIPELINE
from vllm_omni.outputs import OmniRequestOutput

logger = init_logger(__name__)
TALKER_RATE = 24_000
AUDIO_CHUNK_S = 0.2
THINKER, CODE2WAV = 0, 2  # Qwen3-Omni: thinker, talker, code2wav
DEPLOY = Path(vllm_omni.__file__).parent / "deploy" / "qwen3_omni_duplex.yaml"

RECORD: dict[str, list[Any]] = {
    "commands": [],
    "controls": [],
    "requests": [],
    "aborts": [],
}


@dataclasses.dataclass
class Pace:
    """How the fake talker speaks: seconds before the first audio, between chunks, per character."""

    first_audio_delay_s: float = 0.05
    chunk_interval_s: float = 0.02
    seconds_per_char: float = 0.02


def _jsonable(value: Any) -> Any:
    """A command or config as JSON, with audio bytes and long strings (data URLs) replaced by their length."""
    if isinstance(value, bytes | bytearray):
        return {"bytes": len(value)}
    if isinstance(value, str) and len(value) > 256:
        return {"chars": len(value), "head": value[:32]}
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: _jsonable(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_jsonable(v) for v in value]
    if isinstance(value, str | int | float | bool) or value is None:
        return value
    return repr(value)


def _record_command(session_id: str, command: commands.DuplexCommand) -> None:
    entry = {"t": time.monotonic(), "session_id": session_id, "type": type(command).__name__}
    entry.update(_jsonable(command))
    if isinstance(command, commands.AppendAudio):
        entry["audio"] = {"bytes": len(command.audio)}
        entry["video_frames"] = len(command.video_frames)
    RECORD["commands"].append(entry)


class TemplateProcessor:
    """The processor's chat template, made readable: the formatted messages as JSON."""

    def apply_chat_template(self, messages: list[dict[str, Any]], **_: Any) -> str:
        return json.dumps(messages)


def _describe(messages: list[dict[str, Any]], audios: list[Any], images: list[Any]) -> tuple[str, dict[str, Any]]:
    """The answer to a prompt: what it held, in order, so a test can read the context back.

    "heard" is the audio of the turn being answered (the user messages after the last answer)."""
    audio_ms = [round(len(samples) * 1000 / rate) for samples, rate in audios]
    history: list[str] = []
    heard_ms = audio_index = image_index = 0
    for message in messages:
        role = message["role"]
        if role == "system":
            continue
        if role == "assistant":
            heard_ms = 0
        content = message["content"]
        for part in [{"type": "text", "text": content}] if isinstance(content, str) else content:
            if part["type"] == "audio":
                history.append(f"{role} audio {audio_ms[audio_index]} ms")
                heard_ms += audio_ms[audio_index]
                audio_index += 1
            elif part["type"] == "image":
                width, height = images[image_index].size
                history.append(f"{role} image {width}x{height}")
                image_index += 1
            elif part["type"] == "text":
                words = part["text"].split()
                history.append(f"{role} '{' '.join(words[:6])}{' ...' if len(words) > 6 else ''}'")
    turn = len(RECORD["requests"]) + 1
    text = f"Answer {turn}. heard {heard_ms} ms of audio; images: {len(images)}; history: {' | '.join(history)}."
    summary = {
        "turn": turn,
        "system": [m["content"] for m in messages if m["role"] == "system"],
        "audio_ms": audio_ms,
        "images": [list(image.size) for image in images],
        "history": history,
        "answer": text,
    }
    return text, summary


def _text_output(request_id: str, text: str, finished: bool) -> OmniRequestOutput:
    completion = CompletionOutput(index=0, text=text, token_ids=[1], cumulative_logprob=None, logprobs=None)
    return OmniRequestOutput(
        request_id=request_id, stage_id=THINKER, final_output_type="text", outputs=[completion], finished=finished
    )


def _audio_output(request_id: str, start: int, count: int, finished: bool) -> OmniRequestOutput:
    t = (np.arange(count) + start) / TALKER_RATE
    tone = torch.tensor(0.3 * np.sin(2 * math.pi * 440.0 * t), dtype=torch.float32)
    return OmniRequestOutput(
        request_id=request_id,
        stage_id=CODE2WAV,
        final_output_type="audio",
        _multimodal_output={"audio": tone, "sr": TALKER_RATE},
        finished=finished,
    )


def _report_failure(task: asyncio.Task[None]) -> None:
    if not task.cancelled() and task.exception() is not None:
        logger.error("fake generation failed", exc_info=task.exception())


class FakeStages(DuplexStagePort):
    """The orchestrator's stage pools, without a model: each submitted turn is answered in words,
    then in a tone, fed to the session's runner the way `DuplexOrchestrator` feeds stage outputs."""

    def __init__(self, pace: Pace) -> None:
        self.pace = pace
        self.manager: DuplexSessionManager | None = None
        self.defaults = (SamplingParams(max_tokens=2048), SamplingParams(max_tokens=4096), SamplingParams())
        self.contexts: dict[str, DuplexStageRequestContext] = {}
        self.generations: dict[str, asyncio.Task[None]] = {}

    @property
    def stage_count(self) -> int:
        return 3

    def sampling_defaults(self) -> tuple[object, ...]:
        return self.defaults

    def ensure_request(self, context: DuplexStageRequestContext) -> None:
        self.contexts[context.request_id] = context

    async def submit(self, submission: DuplexStageSubmission) -> DuplexStageSubmissionResult:
        context = submission.context
        prompt = submission.prompt
        mm = prompt.get("multi_modal_data") or {}
        messages = json.loads(str(prompt["prompt"]))
        text, summary = _describe(messages, list(mm.get("audio", [])), list(mm.get("image", [])))
        params = context.stage_sampling_params
        RECORD["requests"].append(
            {
                "t": time.monotonic(),
                "request_id": context.request_id,
                "session_id": context.session_id,
                "instructions": context.runtime_config.get("instructions"),
                "temperature": getattr(params, "temperature", None),
                "max_tokens": getattr(params, "max_tokens", None),
                **summary,
            }
        )
        # The generation starts on the next loop turn, after the runner has bound the request.
        generation = asyncio.create_task(self._generate(context, text))
        generation.add_done_callback(_report_failure)
        self.generations[context.request_id] = generation
        return DuplexStageSubmissionResult(request_id=context.request_id, stage_id=context.stage_id, replica_id=0)

    def _deliver(self, context: DuplexStageRequestContext, stage_id: int, output: OmniRequestOutput) -> None:
        assert self.manager is not None
        runner = self.manager.runner_for_request_id(context.request_id)
        if runner is None:
            return
        if stage_id != THINKER and not runner.session.stage_request_submitted(stage_id, context.request_id):
            runner.session.bind_stage_request(stage_id, context.request_id, fence=context.fence)
        runner.on_stage_output(
            stage_id,
            output,  # type: ignore[arg-type]  # an OmniRequestOutput, as the stages produce
            None,
            request_id=context.request_id,
            context=DuplexOutputContext(
                identity=DuplexRequestIdentity(session_id=context.session_id, fence=context.fence),
                final_stage_id=context.final_stage_id,
                segment_finished=output.finished,
            ),
        )

    async def _generate(self, context: DuplexStageRequestContext, text: str) -> None:
        rid = context.request_id
        words = text.split(" ")
        for index, word in enumerate(words):
            self._deliver(context, THINKER, _text_output(rid, word + ("" if index == len(words) - 1 else " "), False))
            await asyncio.sleep(0)
        self._deliver(context, THINKER, _text_output(rid, "", True))
        total = max(1, round(len(text) * self.pace.seconds_per_char * TALKER_RATE))
        chunk = int(AUDIO_CHUNK_S * TALKER_RATE)
        await asyncio.sleep(self.pace.first_audio_delay_s)
        for start in range(0, total, chunk):
            count = min(chunk, total - start)
            self._deliver(context, CODE2WAV, _audio_output(rid, start, count, start + count >= total))
            await asyncio.sleep(self.pace.chunk_interval_s)

    def _stop(self, request_ids: list[str], how: str) -> None:
        for rid in request_ids:
            task = self.generations.pop(rid, None)
            if task is not None and not task.done():
                task.cancel()
                RECORD["aborts"].append({"t": time.monotonic(), "request_id": rid, "by": how})

    async def cleanup(self, request_ids: list[str], *, abort: bool = False) -> None:
        if abort:
            self._stop(request_ids, "cleanup")
        for rid in request_ids:
            self.contexts.pop(rid, None)

    async def abort_requests(self, request_ids: list[str]) -> None:
        self._stop(request_ids, "abort")


class _Results:
    """The RPC result queue: each control result answers the waiter of its control id."""

    def __init__(self) -> None:
        self.waiters: dict[str, asyncio.Future[DuplexControlResultMessage]] = {}

    async def put(self, result: DuplexControlResultMessage) -> None:
        waiter = self.waiters.pop(result.control_id, None)
        if waiter is not None and not waiter.done():
            waiter.set_result(result)


class _Events:
    """The engine output queue, read by `DuplexOmni`'s output handler: here, delivered in order."""

    def __init__(self) -> None:
        self.omni: DuplexOmni | None = None

    def put_nowait(self, message: DuplexSessionEventMessage) -> None:
        assert self.omni is not None
        self.omni._route_engine_message(message)


class FakeEngine:
    """`DuplexOmniEngine`'s session surface, in-process: control operations as correlated
    messages to the manager, commands one-way; the manager runs on the server's own loop."""

    def __init__(self, plugin: DuplexModelPlugin, runtime: DuplexSessionRuntimeConfig, stages: FakeStages) -> None:
        self.plugin = plugin
        self.duplex_session_config = runtime
        self.results = _Results()
        self.events = _Events()
        self.manager = DuplexSessionManager(
            plugin=plugin,
            stage_port=stages,
            output_sink=self.events,  # type: ignore[arg-type]
            result_sink=self.results,  # type: ignore[arg-type]
            runtime_config=runtime,
            model_config=None,
        )
        stages.manager = self.manager
        self.reaper: asyncio.Task[None] | None = None

    @property
    def duplex_capabilities(self) -> DuplexCapabilities:
        return self.plugin.capabilities(max_sessions=self.duplex_session_config.max_sessions)

    async def _control(self, message: Any, timeout: float | None, **noted: Any) -> DuplexControlResultMessage:
        """One control operation, recorded with what the test may want to check (`noted`)."""
        entry = {"t": time.monotonic(), "op": message.type, "session_id": message.session_id}
        RECORD["controls"].append({**entry, **noted})
        if self.reaper is None:  # the orchestrator's background task, on the serving loop
            self.reaper = asyncio.create_task(self.manager.reaper_loop(asyncio.Event()))
        waiter = asyncio.get_running_loop().create_future()
        self.results.waiters[message.control_id] = waiter
        self.manager.dispatch(message)
        try:
            result = await asyncio.wait_for(waiter, timeout)
        except TimeoutError as exc:
            raise DuplexSessionError("control timed out", code="timeout", retryable=True) from exc
        if not result.ok:
            raise DuplexSessionError(
                result.error_message or "failed",
                code=result.error_code or "internal_error",
                retryable=result.error_retryable,
                session_id=message.session_id,
            )
        return result

    async def open_session_async(
        self, session_id: str, session_config: DuplexSessionConfig, *, timeout: float | None = 10.0
    ) -> DuplexControlResultMessage:
        message = OpenDuplexSessionMessage(
            control_id=uuid.uuid4().hex, session_id=session_id, session_config=session_config
        )
        return await self._control(message, timeout, config=_jsonable(session_config))

    async def close_session_async(
        self, session_id: str, *, reason: str = "client_close", timeout: float | None = 10.0
    ) -> DuplexControlResultMessage:
        message = CloseDuplexSessionMessage(control_id=uuid.uuid4().hex, session_id=session_id, reason=reason)
        return await self._control(message, timeout, reason=reason)

    async def resume_session_async(
        self,
        session_id: str,
        *,
        expected_lease_generation: int,
        control_id: str | None = None,
        timeout: float | None = 10.0,
    ) -> DuplexControlResultMessage:
        message = ResumeDuplexSessionMessage(
            control_id=control_id or uuid.uuid4().hex,
            session_id=session_id,
            expected_lease_generation=expected_lease_generation,
        )
        return await self._control(message, timeout, lease=expected_lease_generation)

    async def touch_session_async(
        self,
        session_id: str,
        *,
        activity: str,
        expected_lease_generation: int | None = None,
        timeout: float | None = 10.0,
    ) -> DuplexControlResultMessage:
        message = TouchDuplexSessionMessage(
            control_id=uuid.uuid4().hex,
            session_id=session_id,
            activity=activity,
            expected_lease_generation=expected_lease_generation,
        )
        return await self._control(message, timeout, activity=activity)

    async def submit_command_async(self, session_id: str, command: commands.DuplexCommand) -> None:
        _record_command(session_id, command)
        self.manager.dispatch(DuplexSessionCommandMessage(session_id=session_id, command=command))


class FakeDuplexOmni(DuplexOmni):
    """`DuplexOmni` over `FakeEngine`: its handles and routing are the real ones; no stages start."""

    def __init__(self, engine: FakeEngine, model: str) -> None:  # no AsyncOmni: nothing to spawn
        self.engine = engine  # type: ignore[assignment]
        self.model = model
        self._handles = {}
        self._resume_compensations = set()
        self._resume_replay_backoff_s = (0.5, 5.0)
        engine.events.omni = self

    def _final_output_handler(self) -> None:
        """Events are routed as the manager emits them (`_Events`)."""


def create_duplex_handler(model: str, pace: Pace, max_sessions: int | None) -> OmniDuplexSessionHandler:
    """The genuine handler over Qwen3-Omni's shipped duplex deploy file and plugin."""
    runtime = load_deploy_config(DEPLOY).duplex_session
    if max_sessions is not None:
        runtime = dataclasses.replace(runtime, max_sessions=max_sessions)
    assert QWEN3_OMNI_PIPELINE.duplex_plugin is not None
    plugin = load_duplex_plugin(QWEN3_OMNI_PIPELINE.duplex_plugin, encode_audio)
    plugin.processor = TemplateProcessor()  # type: ignore[attr-defined]  # set, so no model files are read
    engine = FakeEngine(plugin, runtime, FakeStages(pace))
    return OmniDuplexSessionHandler(duplex_omni=FakeDuplexOmni(engine, model))
