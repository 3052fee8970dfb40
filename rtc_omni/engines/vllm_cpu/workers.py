"""The classes vLLM-Omni 0.30 loads by qualified name in its stage processes when the CPU
platform (platform.py) is active: a worker and model runner for each kind of LLM stage, and the
diffusion attention backend.

Each is vLLM-Omni's GPU class combined with vLLM's CPU one. The vLLM-Omni internals this relies on:
- `OmniWorkerMixin` (vllm_omni.worker.mixins): what makes a vLLM worker an Omni one (its
  plugins, its KV connector), put in front of vLLM's `CPUWorker`;
- `GPUARModelRunner` and `GPUGenerationModelRunner` (vllm_omni.worker.gpu_ar_model_runner,
  .gpu_generation_model_runner), both subclasses of vLLM's `GPUModelRunner`, as is vLLM's
  `CPUModelRunner`. Listed Omni first, CPU second, the method order puts vLLM's CPU `__init__`
  (which swaps CUDA events and streams for placeholders) around `GPUModelRunner.__init__`, and
  vLLM's CPU `load_model`, `_to_list` and `_sync_device` under vLLM-Omni's overrides;
- vLLM's `CPUWorker.init_device` builds the runner named `CPUModelRunner` in its module
  (vllm.v1.worker.cpu_worker): that name is pointed at our runner for the duration of the call;
- `compilation_config.max_cudagraph_capture_size`, None on CPU: vLLM-Omni sizes Qwen3-Omni's
  talker buffers with `max(max_num_reqs, max_cudagraph_capture_size)`;
- the runner's `_dummy_run`: on CUDA the memory profiling makes one forward pass before the first
  request, and Qwen2.5-Omni's talker sets its `voice_type` in it; the CPU worker profiles nothing
  with an explicit KV cache size, so the worker makes that pass itself;
- `SDPAImpl.forward_cuda` (vllm_omni.diffusion.attention.backends.sdpa): plain PyTorch SDPA, which
  runs on CPU; `AttentionImpl.forward` picks an implementation per platform and has none for CPU;
- `DiffusionWorker` (vllm_omni.diffusion.worker.diffusion_worker) and the requests its three entry
  points receive (`execute_model`, `execute_model_batch`, `execute_stepwise`): the start-up warm-up
  is the one with the id `DUMMY_DIFFUSION_REQUEST_ID` (vllm_omni.diffusion.request), made by
  `DiffusionEngine._dummy_run` at 512x512, whatever the model; the warm-up's height and width are
  sampling parameters the pipeline reads when it runs.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from typing import Any

import vllm.v1.worker.cpu_worker as vllm_cpu_worker
from vllm.v1.worker.cpu_model_runner import CPUModelRunner
from vllm.v1.worker.cpu_worker import CPUWorker
from vllm_omni.diffusion.attention.backends.sdpa import SDPABackend, SDPAImpl
from vllm_omni.diffusion.request import DUMMY_DIFFUSION_REQUEST_ID
from vllm_omni.diffusion.worker.diffusion_worker import DiffusionWorker
from vllm_omni.worker.gpu_ar_model_runner import GPUARModelRunner
from vllm_omni.worker.gpu_generation_model_runner import GPUGenerationModelRunner
from vllm_omni.worker.mixins import OmniWorkerMixin


def _without_cudagraph_sizes(vllm_config: Any) -> None:
    compilation = vllm_config.compilation_config
    if compilation.max_cudagraph_capture_size is None:
        compilation.max_cudagraph_capture_size = 0  # no graphs on CPU: buffers sized by max_num_reqs alone


class CPUARModelRunner(GPUARModelRunner, CPUModelRunner):
    """vLLM-Omni's autoregressive runner (thinker, talker) on vLLM's CPU runner."""

    def __init__(self, vllm_config: Any, device: Any) -> None:
        _without_cudagraph_sizes(vllm_config)
        super().__init__(vllm_config, device)


class CPUGenerationModelRunner(GPUGenerationModelRunner, CPUModelRunner):
    """vLLM-Omni's generation runner (code2wav) on vLLM's CPU runner."""

    def __init__(self, vllm_config: Any, device: Any) -> None:
        _without_cudagraph_sizes(vllm_config)
        super().__init__(vllm_config, device)


@contextmanager
def _cpu_worker_builds(runner_cls: type) -> Iterator[None]:
    original = vllm_cpu_worker.CPUModelRunner
    vllm_cpu_worker.CPUModelRunner = runner_cls  # type: ignore[misc]
    try:
        yield
    finally:
        vllm_cpu_worker.CPUModelRunner = original  # type: ignore[misc]


class _CPUOmniWorker(OmniWorkerMixin, CPUWorker):
    model_runner_cls: type  # read by vLLM-Omni's connector validation (worker.omni_connector_validation)

    def init_device(self) -> None:
        with _cpu_worker_builds(self.model_runner_cls):
            super().init_device()

    def compile_or_warm_up_model(self) -> Any:
        times = super().compile_or_warm_up_model()
        self.model_runner._dummy_run(1)  # the forward pass CUDA's memory profiling would have made
        return times


class CPUARWorker(_CPUOmniWorker):
    model_runner_cls = CPUARModelRunner


class CPUGenerationWorker(_CPUOmniWorker):
    model_runner_cls = CPUGenerationModelRunner


class CPUSDPAImpl(SDPAImpl):
    """PyTorch SDPA, called directly: the CUDA path of vLLM-Omni's SDPA is plain torch."""

    forward = SDPAImpl.forward_cuda


class CPUSDPABackend(SDPABackend):
    @staticmethod
    def get_impl_cls() -> type[CPUSDPAImpl]:
        return CPUSDPAImpl


# The side of the diffusion warm-up on CPU. vLLM-Omni warms every pipeline up at 512x512 before it
# serves: on a GPU that sizes its buffers, on CPU (eager, no graphs) it only checks that the
# pipeline runs, and at 512x512 it took 10 s for tiny Helios; a real model there takes minutes.
WARM_UP_SIDE = 128


def _small_warm_up(requests: Iterable[Any]) -> None:
    for request in requests:
        if request.request_id == DUMMY_DIFFUSION_REQUEST_ID:  # the warm-up, not a paged-KV profile
            params = request.sampling_params
            params.height, params.width = min(params.height, WARM_UP_SIDE), min(params.width, WARM_UP_SIDE)


class CPUDiffusionWorker(DiffusionWorker):
    """vLLM-Omni's diffusion worker, with its start-up warm-up at `WARM_UP_SIDE` square."""

    def execute_model(self, req: Any, *args: Any, **kwargs: Any) -> Any:
        _small_warm_up([x.req for x in req] if isinstance(req, list) else [req])  # a list: NewRequestData
        return super().execute_model(req, *args, **kwargs)

    def execute_model_batch(self, scheduler_output: Any, *args: Any, **kwargs: Any) -> Any:
        _small_warm_up(x.req for x in scheduler_output.scheduled_new_reqs)
        return super().execute_model_batch(scheduler_output, *args, **kwargs)

    def execute_stepwise(self, scheduler_output: Any, *args: Any, **kwargs: Any) -> Any:
        _small_warm_up(x.req for x in scheduler_output.scheduled_new_reqs)
        return super().execute_stepwise(scheduler_output, *args, **kwargs)
