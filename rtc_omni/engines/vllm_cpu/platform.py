"""The CPU platform for vLLM-Omni 0.30: vLLM's `CpuPlatform` with the Omni interface filled in.

vLLM-Omni resolves it by qualified name (`activate()` names it) in every process it starts. What
vLLM-Omni 0.30 asks of a platform, and where this leans on its internals:
- `OmniPlatform` (vllm_omni.platforms.interface) and its `OmniPlatformEnum.OOT`: the base class
  and the kind every out-of-tree platform reports;
- `get_omni_ar_worker_cls` / `get_omni_generation_worker_cls`: the worker classes for the
  autoregressive stages (thinker, talker) and the generation stages (code2wav), by qualified
  name (vllm_omni.engine.arg_utils, vllm_omni.engine.stage_init_utils);
- `get_diffusion_attn_backend_cls`: the diffusion attention backend (vllm_omni.diffusion.attention.selector);
- `get_diffusion_worker_cls`: the diffusion worker class, by qualified name (vllm_omni.diffusion.executor);
- the device and memory helpers its workers call on `current_omni_platform`: `OmniPlatform`
  declares them without a body, and the CUDA names `empty_cache`, `reset_peak_memory_stats`,
  `max_memory_*` (which vLLM's `Platform.__getattr__` looks up on `torch.cpu`, where they do not
  exist) are no-ops here.
"""

from __future__ import annotations

import psutil
import torch
from vllm.platforms.cpu import CpuPlatform
from vllm_omni.platforms.interface import OmniPlatform, OmniPlatformEnum

WORKERS = "rtc_omni.engines.vllm_cpu.workers"


class CPUOmniPlatform(OmniPlatform, CpuPlatform):
    """vLLM's CPU platform (its enum says CPU to vLLM) that vLLM-Omni sees as out-of-tree."""

    _omni_enum = OmniPlatformEnum.OOT

    @classmethod
    def get_omni_ar_worker_cls(cls) -> str:
        return f"{WORKERS}.CPUARWorker"

    @classmethod
    def get_omni_generation_worker_cls(cls) -> str:
        return f"{WORKERS}.CPUGenerationWorker"

    @classmethod
    def get_diffusion_worker_cls(cls) -> str:
        return f"{WORKERS}.CPUDiffusionWorker"  # its start-up warm-up is small

    @classmethod
    def get_default_stage_config_path(cls) -> str:
        return "vllm_omni/deploy"  # the shipped deploy YAMLs; rtc-omni passes CPU ones (deploy.py)

    @classmethod
    def get_diffusion_attn_backend_cls(
        cls, selected_backend: str | None, head_size: int, allow_trtllm_default: bool = False
    ) -> str:
        # PyTorch's scaled_dot_product_attention is the one diffusion backend that runs on CPU.
        return f"{WORKERS}.CPUSDPABackend"

    @classmethod
    def supports_torch_inductor(cls) -> bool:
        return False  # the CPU deploy settings run eager; nothing may try to compile

    @classmethod
    def supports_talker_mtp_graph_capture(cls) -> bool:
        return False

    @classmethod
    def get_torch_device(cls, local_rank: int | None = None) -> torch.device:
        return torch.device("cpu")

    @classmethod
    def get_device_count(cls) -> int:
        return 1

    @classmethod
    def get_device_version(cls) -> str | None:
        return None

    @classmethod
    def synchronize(cls) -> None:
        return None

    @classmethod
    def get_free_memory(cls, device: torch.device | None = None) -> int:
        return int(psutil.virtual_memory().available)

    @classmethod
    def get_device_memory(cls, device: torch.device | None = None) -> tuple[int, int]:
        memory = psutil.virtual_memory()
        return int(memory.available), int(memory.total)

    @classmethod
    def get_device_total_memory(cls, device_id: int = 0) -> int:
        return int(psutil.virtual_memory().total)

    @classmethod
    def empty_cache(cls) -> None:
        return None

    @classmethod
    def reset_peak_memory_stats(cls, device: torch.device | None = None) -> None:
        return None

    @classmethod
    def max_memory_allocated(cls, device: torch.device | None = None) -> int:
        return 0

    @classmethod
    def max_memory_reserved(cls, device: torch.device | None = None) -> int:
        return 0
