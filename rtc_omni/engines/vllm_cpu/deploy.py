"""vLLM-Omni deploy settings for running a model directory on CPU, chosen from its layout.

vLLM-Omni's shipped deploy YAMLs do not run on CPU as they are: they reserve 0.8-0.9 of the
device per stage (vLLM's CPU worker reads `gpu_memory_utilization` as a fraction of host RAM),
ask for CUDA graphs, Triton MoE kernels and async scheduling. On CPU rtc-omni passes an overlay
of the shipped YAML for the model's layout (its `base_config`, so the stages, connectors and
default sampling parameters stay vLLM-Omni's) with the settings below; `--deploy-config`
replaces it. This module imports nothing from vLLM: the suite's fast tier tests it.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

# What every LLM stage needs on a few CPU cores.
CPU_STAGE: dict[str, Any] = {
    "devices": "0",  # vLLM's CPU worker reads it as the NUMA memory node: there is one, not one per GPU
    "enforce_eager": True,  # no CUDA graphs, no compilation
    "async_scheduling": False,
    "gpu_memory_utilization": 0.1,  # a fraction of host RAM on CPU
    "max_model_len": 4096,
    "engine_extras": {"kv_cache_memory_bytes": 256 * 1024 * 1024},  # explicit: no profiling pass
}


# Environment for vLLM on CPU, set before the stages start (they inherit it) unless the user set it.
# vLLM's CPU platform runs each engine's one worker in a process of its own (the "mp" executor),
# so that it can set the OpenMP environment before torch loads. Each stage then imports vLLM twice,
# about 14 CPU-seconds each; with a stage's worker in the stage's process, a three-stage
# Qwen-Omni server starts in about 60 % of the time, with the same output (docs/vllm.md).
CPU_ENVIRONMENT: dict[str, str] = {"VLLM_ENABLE_V1_MULTIPROCESSING": "0"}


@dataclass(frozen=True)
class Layout:
    """A model layout vLLM-Omni serves as a multi-stage pipeline, and what it needs on CPU."""

    base_yaml: str  # the shipped deploy YAML (vllm_omni/deploy/) it overlays
    dtype: str
    stages: int
    stage_extras: dict[str, Any] = field(default_factory=dict)


LAYOUTS: dict[str, Layout] = {
    # Code2wav integrates in the speaker conditioning's dtype (float32): bfloat16 weights fail
    # with "mat1 and mat2 must have the same dtype".
    "qwen2_5_omni": Layout("qwen2_5_omni.yaml", "float32", 3),
    # The talker casts the thinker's TTS embeddings to bfloat16, so float32 fails the other way;
    # the shipped YAML asks for Triton MoE, which has no CPU kernel ("auto" picks vLLM's CPU MoE).
    "qwen3_omni_moe": Layout("qwen3_omni_moe.yaml", "bfloat16", 3, {"moe_backend": "auto"}),
}


def model_type(model: str) -> str | None:
    """The `model_type` of a local model directory's config.json; None for a diffusers pipeline
    (model_index.json), a hub id, or a directory without one."""
    config = Path(model) / "config.json"
    if not config.is_file() or (Path(model) / "model_index.json").is_file():
        return None
    try:
        value = json.loads(config.read_text()).get("model_type")
    except (OSError, ValueError, AttributeError):
        return None
    return value if isinstance(value, str) else None


def overlay(layout: Layout, shipped_dir: Path) -> dict[str, Any]:
    """The deploy YAML (as a dict) that runs `layout` on CPU."""
    stage = {**CPU_STAGE, **layout.stage_extras}
    return {
        "base_config": str(shipped_dir / layout.base_yaml),
        "dtype": layout.dtype,
        "stages": [{"stage_id": stage_id, **stage} for stage_id in range(layout.stages)],
    }


def shipped_deploy_dir() -> Path:
    """vllm_omni/deploy/, where vLLM-Omni 0.30 keeps its deploy YAMLs (a vLLM-Omni internal)."""
    import importlib.util

    spec = importlib.util.find_spec("vllm_omni")
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError("vllm_omni is not installed")
    return Path(next(iter(spec.submodule_search_locations))) / "deploy"


def cpu_deploy_config(model: str, shipped_dir: Path | None = None) -> Path | None:
    """A deploy YAML for `model` on CPU, or None when its layout needs none (a diffusion pipeline
    such as Wan or Helios) or is not one rtc-omni knows (vLLM-Omni's defaults then apply).

    The file is written once per content under the temporary directory (YAML reads JSON)."""
    layout = LAYOUTS.get(model_type(model) or "")
    if layout is None:
        return None
    text = json.dumps(overlay(layout, shipped_dir or shipped_deploy_dir()), indent=2)
    digest = hashlib.sha256(text.encode()).hexdigest()[:16]
    path = (
        Path(tempfile.gettempdir()) / "rtc-omni-cpu-deploy" / f"{layout.base_yaml.removesuffix('.yaml')}-{digest}.yaml"
    )
    if not path.is_file():
        path.parent.mkdir(parents=True, exist_ok=True)
        partial = path.with_suffix(f".{os.getpid()}.part")
        partial.write_text(text)
        partial.replace(path)  # atomic: servers starting together never read half a file
    return path
