"""Stage processes that start with vLLM-Omni already imported, on CPU.

vLLM-Omni 0.30 starts each LLM stage (thinker, talker, code2wav) with the `spawn` method: a fresh
interpreter that imports vLLM-Omni, vLLM, torch and transformers again before it loads a model.
That import is most of a stage's start on CPU (about 19 CPU-seconds each on two cores, the tiny
models load in a tenth of a second), and vLLM-Omni starts the stages one after the other.

On CPU rtc-omni gives vLLM-Omni a `forkserver` context instead: one server process imports the
stage's modules once (`PRELOAD`), and each stage is forked from it, a clean single-threaded
process (vLLM's own API server does the same with its `forkserver` method). A stage still starts
in a process of its own with the parent's current environment, as under `spawn`: vLLM-Omni sets
per-stage variables around each start, which a forked child of the server would not see, so each
process carries the environment it was started with.

The vLLM-Omni internal this relies on: `StageEngineCoreProcManager` (vllm_omni.engine.
stage_engine_core_proc_manager) takes its context from the name `get_mp_context` in its module,
which `vllm_omni.engine.stage_init_utils.prepare_engine_environment` would make `spawn`.
Setting `VLLM_WORKER_MULTIPROC_METHOD` keeps vLLM-Omni's own choice. At exit, when vLLM-Omni has
stopped the stages, rtc-omni ends the fork server and waits for it, so that nothing outlives the
server and its CPU time counts as the server's, as a spawned stage's does. It ends it with SIGTERM,
which the fork server leaves at its default: an interpreter with vLLM-Omni imported takes seconds
of CPU to tear down, for nothing (its stages end with `os._exit` too). The server's pid is a
private attribute of multiprocessing's `ForkServer` (`_forkserver_pid`, since Python 3.4).
"""

from __future__ import annotations

import atexit
import importlib
import multiprocessing
import multiprocessing.forkserver
import os
import signal
from multiprocessing.context import ForkServerContext, ForkServerProcess
from typing import Any

# What a stage process imports before it builds its engine; everything else is loaded lazily.
PRELOAD = ["vllm_omni.engine.stage_engine_core_proc", "rtc_omni.engines.vllm_cpu.workers"]
MANAGER = "vllm_omni.engine.stage_engine_core_proc_manager"


class StageProcess(ForkServerProcess):
    """A process forked from the preloaded server that runs with the environment it was started in."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.environment = dict(os.environ)

    def run(self) -> None:
        os.environ.clear()
        os.environ.update(self.environment)
        super().run()


class PreloadedContext(ForkServerContext):
    """The `forkserver` context with `StageProcess` processes."""

    Process = StageProcess  # type: ignore[assignment]


def fork_stages_from_preloaded_server() -> bool:
    """Start vLLM-Omni's LLM stages from a server that has imported them, unless the user chose a
    start method with VLLM_WORKER_MULTIPROC_METHOD. The server starts with the first stage: a
    diffusion pipeline runs in this process and needs none. Returns whether it did."""
    if os.environ.get("VLLM_WORKER_MULTIPROC_METHOD"):
        return False
    manager = importlib.import_module(MANAGER)
    context = PreloadedContext()
    manager.get_mp_context = lambda: context  # type: ignore[attr-defined]  # vLLM-Omni's, see above
    multiprocessing.set_forkserver_preload(PRELOAD)
    atexit.register(end_fork_server)
    return True


def end_fork_server() -> None:
    """End the fork server, if one was started, and wait for it."""
    pid = getattr(multiprocessing.forkserver._forkserver, "_forkserver_pid", None)
    if pid is not None:
        os.kill(pid, signal.SIGTERM)
        os.waitpid(pid, 0)
