"""The vLLM-Omni engines against the real vllm-omni 0.30 package, on CPU.

vLLM cannot join the suite's environment (its kernels are CUDA builds), so this module runs in an
environment of its own, built by `bash tests/vllm_cpu/env.sh DIR` (docs/vllm.md); elsewhere it
skips. CI builds that environment and runs this module through
tests/test_vllm_engine.py::test_the_engines_pass_the_contract_checks_against_the_real_vllm_omni.
It checks that what tests/vllm_fakes.py fakes is what vllm-omni produces and accepts: the real
output classes go through the engines, the real parameter helpers build what the engines send,
and the real `vllm serve --omni` parser reads the settings. It is also the tripwire of the CPU
platform plugin (rtc_omni/engines/vllm_cpu/): every vLLM-Omni internal the plugin relies on is
checked here, so a vLLM-Omni release that moves one fails these tests, not a user's server.
tests/test_vllm_cpu_*.py runs real pipelines on tiny models.
"""

from __future__ import annotations

import asyncio
import inspect
import os
from collections.abc import AsyncIterator
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
import simplejpeg

os.environ["HF_HUB_OFFLINE"] = "1"  # vLLM-Omni looks models up on the Hub; tests stay on this machine
pytest.importorskip("vllm_omni", reason="vllm-omni is not installed (see docs/vllm.md)")

import torch  # noqa: E402
from vllm import SamplingParams  # noqa: E402
from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest  # noqa: E402
from vllm.outputs import CompletionOutput  # noqa: E402
from vllm.sampling_params import RequestOutputKind, StructuredOutputsParams  # noqa: E402
from vllm_omni.entrypoints.async_omni import AsyncOmni  # noqa: E402
from vllm_omni.entrypoints.openai.api_server import build_async_omni, omni_init_app_state  # noqa: E402
from vllm_omni.entrypoints.openai.serving_chat import OmniOpenAIServingChat  # noqa: E402
from vllm_omni.inputs.data import OmniDiffusionSamplingParams, OmniInteractionPrompt  # noqa: E402
from vllm_omni.lora.request import LoRARequest  # noqa: E402
from vllm_omni.outputs import OmniRequestOutput  # noqa: E402
from vllm_omni.outputs.mm_outputs import MultimodalCompletionOutput, MultimodalPayload  # noqa: E402
from xgrammar.testing import _is_grammar_accept_string  # noqa: E402

from rtc_omni.config import Settings  # noqa: E402
from rtc_omni.engines.engine import ForcedTool, GenerateRequest, TurnFrame, UnderstandTurn  # noqa: E402
from rtc_omni.engines.tool_calls import forced_schema  # noqa: E402
from rtc_omni.engines.vllm_cpu import PLATFORM  # noqa: E402
from rtc_omni.engines.vllm_cpu.deploy import LAYOUTS, cpu_deploy_config, shipped_deploy_dir  # noqa: E402
from rtc_omni.engines.vllm_omni import (  # noqa: E402
    CODEC_FRAME_SAMPLES,
    OmniGenerateEngine,
    OmniUnderstandEngine,
    chat_request,
    diffusion_params,
)
from rtc_omni.engines.vllm_runtime import (  # noqa: E402
    ChatService,
    DiffusionParams,
    EngineUnavailable,
    installed_version,
    parse_serve_args,
    serve_argv,
)

from .vllm_cpu.tiny_models import QWEN3_CHAT_TEMPLATE, byte_level_tokenizer  # noqa: E402
from .vllm_fakes import TOOL_HISTORY, WEATHER  # noqa: E402

VIDEO_STAGE = {"stage_type": "diffusion", "final_output": True, "final_output_type": "video"}


class Replay:
    """An AsyncOmni whose generate() replays prepared outputs and records its arguments."""

    def __init__(self, outputs: list[Any]) -> None:
        self.outputs = outputs
        self.kwargs: list[dict[str, Any]] = []
        self.interactions: list[Any] = []

    async def generate(self, **kwargs: Any) -> AsyncIterator[Any]:
        self.kwargs.append(kwargs)
        for output in self.outputs:
            await asyncio.sleep(0)
            yield output

    async def abort(self, request_id: str) -> None: ...

    async def submit_interaction_async(self, request_id: str, *, interaction: Any) -> None:
        self.interactions.append(interaction)


class NoChat:
    async def engine_prompt(self, request: dict[str, Any]) -> Any:
        return {"prompt_token_ids": [0]}

    def sampling_params(self, per_stage: list[dict[str, Any]]) -> list[Any]:
        return per_stage


def text(delta: str) -> OmniRequestOutput:
    completion = CompletionOutput(index=0, text=delta, token_ids=[1], cumulative_logprob=None, logprobs=None)
    return OmniRequestOutput(request_id="r", final_output_type="text", outputs=[completion], finished=False)


def audio(*steps: int, start: int) -> OmniRequestOutput:
    """A DELTA audio output as the output processor builds it: a payload of the new tensors."""
    tensors, position = [], start
    for count in steps:
        tensors.append(torch.arange(position, position + count, dtype=torch.float32).reshape(1, -1) / 1e6)
        position += count
    payload = MultimodalPayload.from_dict({"audio": tensors[0] if len(tensors) == 1 else tensors})
    completion = MultimodalCompletionOutput(
        multimodal_output=payload, index=0, text="", token_ids=[], cumulative_logprob=None, logprobs=None
    )
    return OmniRequestOutput(request_id="r", final_output_type="audio", outputs=[completion], finished=False)


def test_the_installed_series_is_the_one_the_engines_were_written_for() -> None:
    assert installed_version().startswith("0.30")


def test_real_understanding_outputs_become_text_and_talker_audio() -> None:
    steps = [[4 * 1920], [25 * 1920, 960], [1920]]
    outputs: list[Any] = [text("The"), text(" red"), text(" reddish")]
    position = 0
    for group in steps:
        outputs.append(audio(*group, start=position))
        position += sum(group)
        outputs.append(text(" wall"))
    engine = OmniUnderstandEngine(Replay(outputs), NoChat())
    turn = UnderstandTurn(request_id="r", frames=[], audio_pcm16=b"", query="q")

    async def run() -> tuple[str, np.ndarray]:
        got_text, got_audio = "", []
        async for item in engine.generate(turn):
            if hasattr(item, "text"):
                got_text += item.text
            else:
                got_audio.append(item.samples)
        return got_text, np.concatenate(got_audio)

    got_text, got_audio = asyncio.run(run())
    assert got_text == "The red reddish wall wall wall"
    assert got_audio.size == position - CODEC_FRAME_SAMPLES
    assert np.abs(got_audio - np.arange(CODEC_FRAME_SAMPLES, position) / 1e6).max() < 1e-6


def test_the_chat_request_is_one_vllm_accepts() -> None:
    frame = TurnFrame(frame_id="f1", pts_ms=0.0, jpeg=simplejpeg.encode_jpeg(np.full((48, 64, 3), 200, np.uint8)))
    turn = UnderstandTurn(
        request_id="r",
        frames=[frame, frame],
        audio_pcm16=b"\x00\x01" * 1600,
        query="What colour?",
        history=[{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}],
        system_prompt="Be brief.",
        model="qwen3-omni",
    )
    request = ChatCompletionRequest(**chat_request(turn))
    assert request.stream and request.modalities == ["text", "audio"] and not request.add_special_tokens
    assert request.mm_processor_kwargs == {"use_audio_in_video": True}
    parts = request.messages[-1]["content"]
    assert [p["type"] for p in parts] == ["image_pil", "image_pil", "input_audio", "text"]
    assert parts[0]["uuid"] == parts[1]["uuid"] and parts[0]["image_pil"].size == (64, 48)


def test_session_sampling_params_become_streaming_stage_params() -> None:
    chat = object.__new__(OmniOpenAIServingChat)  # only engine_client is read by the conversion
    llm = SimpleNamespace(stage_type="llm")
    chat.engine_client = SimpleNamespace(
        stage_configs=[llm, llm, llm], default_sampling_params_list=[SamplingParams(max_tokens=9)] * 3
    )
    params = ChatService(chat).sampling_params([{"temperature": 0.2, "max_tokens": 64}, {"top_k": 10}])
    assert [type(p) for p in params] == [SamplingParams] * 3  # the omitted third stage gets its default
    assert params[0].temperature == 0.2 and params[0].max_tokens == 64 and params[1].top_k == 10
    assert params[2].max_tokens == 9
    assert all(p.output_kind == RequestOutputKind.DELTA for p in params)
    with pytest.raises(TypeError):
        ChatService(chat).sampling_params([{"temprature": 1}])


def test_diffusion_params_are_built_by_the_real_helpers() -> None:
    omni = SimpleNamespace(
        stage_configs=[VIDEO_STAGE], default_sampling_params_list=[OmniDiffusionSamplingParams(num_inference_steps=7)]
    )
    runtime = DiffusionParams(omni)
    assert runtime.video_output
    assert not DiffusionParams(SimpleNamespace(stage_configs=[{"stage_type": "diffusion"}])).video_output
    request = GenerateRequest(
        request_id="g",
        prompt="p",
        width=832,
        height=480,
        num_frames=33,
        fps=16,
        extra_params={"is_amplify_first_chunk": True},
        sampling_overrides={"seed": 5, "flow_shift": 3.0},
        lora={"name": "style", "path": "/loras/style", "scale": 0.5},
    )
    params = diffusion_params(runtime, request)
    assert isinstance(params, OmniDiffusionSamplingParams)
    assert (params.width, params.height, params.num_frames, params.fps, params.frame_rate) == (832, 480, 33, 16, 16.0)
    assert params.num_inference_steps == 7 and params.seed == 5  # engine default kept, explicit value set
    assert params.extra_args == {"flow_shift": 3.0, "is_amplify_first_chunk": True}
    assert isinstance(params.lora_request, LoRARequest) and params.lora_scale == 0.5
    assert omni.default_sampling_params_list[0].seed is None  # the default was copied, not changed
    (stage,) = runtime.stage_params(params)
    assert stage is not params and stage.seed == 5


def test_interactions_and_chunk_reports_have_vllm_omnis_shapes() -> None:
    runtime = DiffusionParams(SimpleNamespace(stage_configs=[VIDEO_STAGE], default_sampling_params_list=[]))
    interaction = runtime.interaction("e1", "blue", 2)
    assert set(interaction) <= set(OmniInteractionPrompt.__annotations__)
    assert OmniInteractionPrompt.__required_keys__ <= set(interaction)
    stream = {"generation_chunk_index": 4, "started_event_ids": ["e1"], "active_event_ids": ["e1"]}
    frames = torch.zeros((1, 8, 16, 16, 3))
    output = OmniRequestOutput.from_diffusion(
        request_id="g",
        images=[frames],
        multimodal_output={"metadata": {"stream": {**stream, "completed_event_ids": []}}},
        final_output_type="video",
        finished=False,
    )
    client = Replay([output])
    engine = OmniGenerateEngine(client, runtime)
    request = GenerateRequest(request_id="g", prompt="p", width=16, height=16, num_frames=8, fps=16)

    async def run() -> list[Any]:
        chunks = []
        async for chunk in engine.generate(request):
            chunks.append(chunk)
            await engine.interact("g", "e1", "blue", 2)
        return chunks

    (chunk,) = asyncio.run(run())
    assert chunk.chunk_index == 4 and chunk.events.started == ["e1"] and chunk.events.completed == []
    assert chunk.frames[0] is frames
    assert client.interactions == [{"event_id": "e1", "event": {"prompt": "blue"}, "transition_chunks": 2}]


def test_the_engine_calls_match_asyncomnis_signatures() -> None:
    generate = inspect.signature(AsyncOmni.generate).parameters
    assert {"prompt", "request_id", "output_modalities", "sampling_params_list"} <= set(generate)
    assert list(inspect.signature(AsyncOmni.abort).parameters)[:2] == ["self", "request_id"]
    interact = inspect.signature(AsyncOmni.submit_interaction_async).parameters
    assert interact["interaction"].kind is inspect.Parameter.KEYWORD_ONLY
    assert list(inspect.signature(omni_init_app_state).parameters)[:3] == ["engine_client", "state", "args"]
    assert list(inspect.signature(build_async_omni).parameters)[0] == "args"
    preprocess = inspect.signature(OmniOpenAIServingChat._preprocess_chat).parameters
    used = {"default_template", "default_template_content_format", "renderer", "add_generation_prompt"}
    assert used | {"continue_final_message", "add_special_tokens"} <= set(preprocess)


def test_the_settings_become_a_vllm_serve_command_line() -> None:
    settings = Settings(
        engine="vllm",
        model="BestWishYsh/Helios-Distilled",
        stage_overrides='{"0": {"enforce_eager": true}}',
        engine_arg=["diffusion_streaming_output", "max-model-len=8192"],
    )
    args = parse_serve_args(serve_argv(settings))
    explicit = args.get_explicit_kwargs_dict()
    assert args.model == "BestWishYsh/Helios-Distilled" and args.omni
    assert explicit["stage_overrides"] == {"0": {"enforce_eager": True}}
    assert explicit["diffusion_streaming_output"] is True and explicit["max_model_len"] == 8192
    with pytest.raises(EngineUnavailable):
        parse_serve_args(serve_argv(settings.model_copy(update={"engine_arg": ["no-such-flag"]})))


# ----------------------------------------------------------------------------- the CPU platform plugin
# Each test names the vLLM-Omni 0.30 internal it guards; rtc_omni/engines/vllm_cpu/ says why it is used.


def test_vllm_omni_finds_the_cpu_platform_through_the_entry_point() -> None:
    from importlib.metadata import entry_points

    from vllm.platforms import current_platform
    from vllm_omni.platforms import current_omni_platform
    from vllm_omni.plugins import OMNI_PLATFORM_PLUGINS_GROUP

    assert current_platform.is_cpu(), "this environment must have vLLM's CPU build (vllm-cpu, tests/vllm_cpu/env.sh)"
    assert OMNI_PLATFORM_PLUGINS_GROUP == "vllm_omni.platform_plugins"
    (plugin,) = entry_points(group=OMNI_PLATFORM_PLUGINS_GROUP, name="rtc_omni_cpu")
    assert plugin.value == "rtc_omni.engines.vllm_cpu:activate" and plugin.load()() == PLATFORM
    platform = type(current_omni_platform)
    assert f"{platform.__module__}.{platform.__qualname__}" == PLATFORM
    assert current_omni_platform.is_cpu() and current_omni_platform.is_out_of_tree()


def test_the_cpu_platform_implements_what_omni_platform_leaves_unimplemented() -> None:
    from vllm_omni.platforms.interface import OmniPlatform

    from rtc_omni.engines.vllm_cpu.platform import CPUOmniPlatform

    unimplemented = [
        name
        for name, member in vars(OmniPlatform).items()
        if isinstance(member, classmethod) and "raise NotImplementedError" in inspect.getsource(member.__func__)
    ]
    assert "get_omni_ar_worker_cls" in unimplemented and "get_torch_device" in unimplemented
    # OmniPlatform comes first in the method order, so its unimplemented methods hide CpuPlatform's.
    assert [name for name in unimplemented if name not in vars(CPUOmniPlatform)] == []
    selector = inspect.signature(OmniPlatform.get_diffusion_attn_backend_cls).parameters
    assert list(selector) == list(inspect.signature(CPUOmniPlatform.get_diffusion_attn_backend_cls).parameters)


def test_the_cpu_workers_combine_vllm_omnis_runners_with_vllms_cpu_runner() -> None:
    import vllm.v1.worker.cpu_worker as vllm_cpu_worker
    from vllm.v1.worker.cpu_model_runner import CPUModelRunner
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner
    from vllm_omni.worker.gpu_ar_model_runner import GPUARModelRunner
    from vllm_omni.worker.gpu_model_runner import OmniGPUModelRunner
    from vllm_omni.worker.omni_connector_validation import validate_worker_omni_connector

    from rtc_omni.engines.vllm_cpu import workers

    for worker, omni_runner in ((workers.CPUARWorker, GPUARModelRunner), (workers.CPUGenerationWorker, None)):
        mro = worker.model_runner_cls.__mro__
        # vLLM-Omni's runner first, then vLLM's CPU runner, then the GPU runner both derive from.
        assert mro.index(CPUModelRunner) < mro.index(GPUModelRunner)
        assert mro.index(OmniGPUModelRunner) < mro.index(CPUModelRunner)
        assert omni_runner is None or mro[1] is omni_runner
        validate_worker_omni_connector(worker, required=True)  # reads model_runner_cls
        assert "num_tokens" in inspect.signature(worker.model_runner_cls._dummy_run).parameters
    # CPUWorker.init_device builds the runner it finds under this module name.
    assert vllm_cpu_worker.CPUModelRunner is CPUModelRunner
    assert "CPUModelRunner" in vllm_cpu_worker.CPUWorker.init_device.__code__.co_names
    assert "max_cudagraph_capture_size" in inspect.getsource(OmniGPUModelRunner)
    assert "compile_or_warm_up_model" in vars(vllm_cpu_worker.CPUWorker)


def test_the_cpu_diffusion_attention_is_torch_sdpa() -> None:
    from vllm_omni.diffusion.attention.backends.abstract import AttentionImpl
    from vllm_omni.diffusion.attention.selector import _load_backend_cls

    from rtc_omni.engines.vllm_cpu.platform import CPUOmniPlatform

    backend = _load_backend_cls(CPUOmniPlatform.get_diffusion_attn_backend_cls(None, 64))
    impl = backend.get_impl_cls()(num_heads=2, head_size=8, softmax_scale=8**-0.5)
    assert isinstance(impl, AttentionImpl)
    query, key, value = (torch.randn(1, 5, 2, 8) for _ in range(3))  # (batch, tokens, heads, head size)
    expected = torch.nn.functional.scaled_dot_product_attention(*(x.transpose(1, 2) for x in (query, key, value)))
    assert torch.allclose(impl.forward(query, key, value), expected.transpose(1, 2), atol=1e-5)


def test_the_cpu_diffusion_warm_up_is_small_and_nothing_else_changes() -> None:
    from vllm_omni.diffusion.diffusion_engine import DiffusionEngine
    from vllm_omni.diffusion.executor.uniproc_executor import UniProcDiffusionExecutor
    from vllm_omni.diffusion.request import DUMMY_DIFFUSION_REQUEST_ID, OmniDiffusionRequest
    from vllm_omni.diffusion.worker.diffusion_worker import DiffusionWorker

    from rtc_omni.engines.vllm_cpu.platform import CPUOmniPlatform
    from rtc_omni.engines.vllm_cpu.workers import WARM_UP_SIDE, CPUDiffusionWorker

    # vLLM-Omni warms up at 512x512 under this id, and builds the worker the platform names.
    assert "DUMMY_DIFFUSION_REQUEST_ID" in inspect.getsource(DiffusionEngine._make_dummy_request)
    assert "height=512" in inspect.getsource(DiffusionEngine._dummy_run)
    assert "get_diffusion_worker_cls" in inspect.getsource(UniProcDiffusionExecutor._init_executor)
    assert CPUOmniPlatform.get_diffusion_worker_cls() == f"{CPUDiffusionWorker.__module__}.CPUDiffusionWorker"
    for method in ("execute_model", "execute_model_batch", "execute_stepwise"):
        assert method in vars(DiffusionWorker)
    worker = object.__new__(CPUDiffusionWorker)
    seen = []
    worker.model_runner = SimpleNamespace(execute_model=lambda req, **kwargs: seen.append(req))
    worker.lora_manager = None
    worker._get_profiler = lambda: None

    def request(request_id: str) -> Any:
        params = OmniDiffusionSamplingParams(height=512, width=512, num_inference_steps=2, num_frames=1)
        return OmniDiffusionRequest(prompt={"prompt": "dummy run"}, request_id=request_id, sampling_params=params)

    worker.execute_model(request(DUMMY_DIFFUSION_REQUEST_ID), None)
    worker.execute_model(request("a-user-request"), None)
    assert [(r.sampling_params.height, r.sampling_params.width) for r in seen] == [
        (WARM_UP_SIDE, WARM_UP_SIDE),
        (512, 512),
    ]


def test_stage_processes_start_from_the_preloaded_server() -> None:
    import importlib.util

    from vllm_omni.engine import stage_engine_core_proc_manager as manager
    from vllm_omni.engine.stage_init_utils import prepare_engine_environment

    from rtc_omni.engines.vllm_cpu.stage_processes import MANAGER, PRELOAD

    # The manager takes its context from this name in its module; vLLM-Omni would make it spawn.
    assert manager.__name__ == MANAGER and callable(manager.get_mp_context)
    assert "get_mp_context" in manager.StageEngineCoreProcManager.__init__.__code__.co_names
    assert '"spawn"' in inspect.getsource(prepare_engine_environment)
    assert all(importlib.util.find_spec(module) is not None for module in PRELOAD)


@pytest.mark.parametrize("layout", sorted(LAYOUTS))
def test_the_cpu_deploy_overlays_load_in_vllm_omni(layout: str, tmp_path: Any) -> None:
    from vllm_omni.config.stage_config import load_deploy_config

    assert (shipped_deploy_dir() / LAYOUTS[layout].base_yaml).is_file()
    (tmp_path / "config.json").write_text(f'{{"model_type": "{layout}"}}')
    path = cpu_deploy_config(str(tmp_path))
    assert path is not None
    deploy = load_deploy_config(path)
    assert deploy.dtype == LAYOUTS[layout].dtype and len(deploy.stages) == LAYOUTS[layout].stages
    for stage in deploy.stages:
        assert stage.devices == "0" and stage.gpu_memory_utilization == 0.1 and stage.max_model_len == 4096
        assert stage.engine_extras["kv_cache_memory_bytes"] == 256 * 1024 * 1024
    assert deploy.stages[1].default_sampling_params["repetition_penalty"] > 1  # the shipped talker defaults stay


def test_session_stage_params_keep_the_deploy_defaults_they_leave_out() -> None:
    chat = object.__new__(OmniOpenAIServingChat)
    llm = SimpleNamespace(stage_type="llm")
    deploy = [
        SamplingParams(temperature=0.0, repetition_penalty=1.1, max_tokens=2048),
        SamplingParams(temperature=0.9, top_k=40, repetition_penalty=1.05, max_tokens=2048),
        SamplingParams(temperature=0.0),
    ]
    chat.engine_client = SimpleNamespace(stage_configs=[llm, llm, llm], default_sampling_params_list=deploy)
    service = ChatService(chat)
    talker_defaults = {"temperature": 0.9, "top_k": 40, "repetition_penalty": 1.05, "max_tokens": 2048}
    assert service.stage_defaults()[1] == talker_defaults
    service.engine_prompt = NoChat().engine_prompt  # type: ignore[method-assign]
    client = Replay([text("hi")])
    engine = OmniUnderstandEngine(client, service)
    turn = UnderstandTurn("r", [], b"", "q", sampling_params_list=[{}, {"top_k": 5}])

    async def run() -> None:
        async for _ in engine.generate(turn):
            pass

    asyncio.run(run())
    thinker, talker, code2wav = client.kwargs[0]["sampling_params_list"]
    assert thinker.repetition_penalty == 1.1 and thinker.temperature == 0.0
    assert talker.top_k == 5 and talker.repetition_penalty == 1.05 and talker.temperature == 0.9
    assert code2wav.temperature == 0.0


# ----------------------------------------------------------------------------- tool calling

# A template with a tool section, as Qwen3-Omni's has (the tiny models' has none).
TOOL_TEMPLATE = (
    "{% if tools %}<|im_start|>system\n<tools>{% for t in tools %}{{ t | tojson }}{% endfor %}</tools><|im_end|>\n"
    "{% endif %}{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}"
    "{% for c in m.tool_calls or [] %}<tool_call>{{ c.function | tojson }}</tool_call>{% endfor %}<|im_end|>\n"
    "{% endfor %}"
)


def test_a_turn_with_tools_and_their_history_is_a_request_vllm_accepts() -> None:
    turn = UnderstandTurn("r", [], b"", "", history=TOOL_HISTORY, tools=(WEATHER,))
    request = ChatCompletionRequest(**chat_request(turn, renders_tools=True))
    assert [tool.function.name for tool in request.tools or []] == ["get_weather"]
    assert [m["role"] for m in request.messages] == ["user", "assistant", "tool"]  # the result is the input
    written = ChatCompletionRequest(**chat_request(turn, renders_tools=False))
    assert written.tools is None and [m["role"] for m in written.messages] == ["system", "user", "assistant", "user"]


def test_a_forced_call_is_a_structured_output_of_the_thinker_stage() -> None:
    chat = object.__new__(OmniOpenAIServingChat)
    llm = SimpleNamespace(stage_type="llm")
    chat.engine_client = SimpleNamespace(stage_configs=[llm] * 3, default_sampling_params_list=[SamplingParams()] * 3)
    schema = forced_schema((WEATHER,), ForcedTool("get_weather"))
    thinker, *_ = ChatService(chat).sampling_params([{"structured_outputs": {"json": schema}}])
    assert isinstance(thinker.structured_outputs, StructuredOutputsParams)
    # The schema as xgrammar's grammar of compact JSON: no whitespace for a model to pad with.
    grammar = thinker.structured_outputs.grammar
    assert _is_grammar_accept_string(grammar, '{"city": "Paris"}')
    assert not _is_grammar_accept_string(grammar, '{"city"\t: "Paris"}')
    assert not _is_grammar_accept_string(grammar, '{"town": "Paris"}') and not _is_grammar_accept_string(grammar, "1")


@pytest.mark.parametrize(("template", "renders"), [(TOOL_TEMPLATE, True), (QWEN3_CHAT_TEMPLATE, False)])
def test_the_template_probe_tells_a_tool_section_from_none(template: str, renders: bool) -> None:
    tokenizer = byte_level_tokenizer(None, ["<|im_start|>", "<|im_end|>"], [])
    chat = SimpleNamespace(
        chat_template=template, renderer=SimpleNamespace(get_tokenizer=lambda: tokenizer), model_config=None
    )
    service = ChatService(chat)
    assert service.template == template and service.renders_tools is renders
