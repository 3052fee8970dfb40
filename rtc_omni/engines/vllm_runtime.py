"""Build the vLLM-Omni engines in-process (`--engine vllm`): AsyncOmni plus its chat preprocessing.

Imported only when `--engine vllm` is chosen: vllm, vllm-omni and torch are never needed by the
base install, the tests or CI. Written against vllm-omni 0.30's API; it needs a CUDA GPU and model
weights, so it is exercised by `benchmarks/vllm_smoke.py` on such a machine, not by the test suite
(which drives engines/vllm_omni.py through fakes of the same object shapes).
"""

from __future__ import annotations

import copy
import json
from typing import Any

from ..config import Settings
from .vllm_omni import OmniGenerateEngine, OmniUnderstandEngine

INSTALL_HINT = (
    "--engine vllm needs vLLM-Omni and a CUDA GPU: pip install 'rtc-omni[vllm]' "
    "(Linux, Python 3.11-3.13; vllm and vllm-omni of the same major.minor)"
)


class EngineUnavailable(RuntimeError):
    """The engine cannot be built here; the message says what to install or change."""


def _engine_kwargs(settings: Settings) -> dict[str, Any]:
    kwargs: dict[str, Any] = {}
    if settings.deploy_config:
        kwargs["deploy_config"] = settings.deploy_config
    if settings.stage_overrides:
        kwargs["stage_overrides"] = json.loads(settings.stage_overrides)
    for arg in settings.engine_arg:
        key, _, raw = arg.partition("=")
        try:
            value: Any = json.loads(raw)
        except ValueError:
            value = raw
        kwargs[key.strip().lstrip("-").replace("-", "_")] = value
    return kwargs


class _DiffusionRuntime:
    """vLLM-Omni's parameter helpers for the generation engine."""

    def __init__(self, omni: Any, stage_types: list[str]) -> None:
        from vllm_omni.entrypoints.openai.stage_params import get_default_sampling_params_list

        self.omni = omni
        self.stage_types = stage_types
        self._defaults = get_default_sampling_params_list(omni)

    def default_params(self) -> Any:
        from vllm_omni.inputs.data import OmniDiffusionSamplingParams

        for params in getattr(self.omni, "default_sampling_params_list", None) or []:
            if isinstance(params, OmniDiffusionSamplingParams):
                return copy.deepcopy(params)
        return OmniDiffusionSamplingParams()

    def stage_params(self, diffusion_params: Any) -> list[Any]:
        from vllm_omni.entrypoints.openai.stage_params import build_stage_sampling_params_list

        return build_stage_sampling_params_list(
            list(self.omni.stage_configs),
            self._defaults,
            diffusion_params=diffusion_params,
            replace_diffusion_params=True,
        )

    def lora(self, lora: dict[str, Any]) -> tuple[Any, float | None]:
        from vllm_omni.entrypoints.openai.utils import parse_lora_request

        result: tuple[Any, float | None] = parse_lora_request(lora)
        return result

    def interaction(self, prompt: str, transition_chunks: int) -> Any:
        from vllm_omni.inputs.data import OmniInteractionPrompt

        return OmniInteractionPrompt(event={"prompt": prompt}, transition_chunks=transition_chunks)


async def _chat_preprocessor(omni: Any, settings: Settings) -> Any:
    """vLLM-Omni's chat service, as its API server builds it, reduced to "request -> engine prompt"."""
    from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest
    from vllm.entrypoints.openai.models.serving import BaseModelPath, OpenAIServingModels
    from vllm_omni.entrypoints.openai.serving_chat import OmniOpenAIServingChat

    models = OpenAIServingModels(
        engine_client=omni, base_model_paths=[BaseModelPath(name=settings.model, model_path=settings.model)]
    )
    chat = OmniOpenAIServingChat(
        omni, models, "assistant", request_logger=None, chat_template=None, chat_template_content_format="auto"
    )

    async def preprocess(request: dict[str, Any]) -> Any:
        chat_request = ChatCompletionRequest(**request)
        _conversation, prompts = await chat._preprocess_chat(
            chat_request,
            chat_request.messages,
            default_template=chat.chat_template,
            default_template_content_format=chat.chat_template_content_format,
            renderer=chat.renderer,
            add_generation_prompt=chat_request.add_generation_prompt,
            continue_final_message=chat_request.continue_final_message,
            add_special_tokens=chat_request.add_special_tokens,
        )
        return prompts[0]

    return preprocess


async def build_vllm_engines(settings: Settings) -> tuple[OmniUnderstandEngine | None, OmniGenerateEngine | None]:
    """AsyncOmni for `settings.model`, serving the one kind its stages support, as vLLM-Omni's
    server decides: diffusion-only stages generate, anything else understands."""
    try:
        from vllm_omni.entrypoints.async_omni import AsyncOmni
        from vllm_omni.entrypoints.openai.utils import get_stage_type
    except ImportError as exc:
        raise EngineUnavailable(f"{INSTALL_HINT} ({exc})") from exc
    omni = AsyncOmni(model=settings.model, **_engine_kwargs(settings))
    stage_types = [str(get_stage_type(stage)) for stage in omni.stage_configs]
    if stage_types and all(t == "diffusion" for t in stage_types):
        return None, OmniGenerateEngine(omni, _DiffusionRuntime(omni, stage_types))
    return OmniUnderstandEngine(omni, await _chat_preprocessor(omni, settings)), None
