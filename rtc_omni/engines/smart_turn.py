"""The end-of-turn model: Smart Turn v3.2 (BSD-2), the probability that a speaker has finished.

It hears how the last 8 s of speech ended, words and prosody both (Whisper-tiny's encoder and a
classifier, 23 languages), and is what semantic turn detection (sessions/end_of_turn.py) asks at
each pause. The weights are the ONNX file inside the `pipecat-ai` 1.14.0 wheel, installed by the
`[turn]` extra: found through the distribution's file list without importing pipecat, checked
against the published size and SHA-256, never downloaded at run time.

Cost is bounded: one inference at a time in the whole process, on one CPU thread, off the event
loop (~4 ms of features and ~35 ms of ONNX, CPU, on 8 s of audio; benchmarks/turn_end.py).
"""

from __future__ import annotations

import functools
import hashlib
import importlib.metadata
import importlib.util
import logging
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np

from ..media.log_mel import log_mel
from ..pcm import pcm16_to_float

logger = logging.getLogger(__name__)

DISTRIBUTION = "pipecat-ai"
MODEL_FILE = "pipecat/audio/turn/smart_turn/data/smart-turn-v3.2-cpu.onnx"
MODEL_BYTES = 8_679_182
MODEL_SHA256 = "2bb026316b14a660486a75b1733cd3fbab8c2fd0314dc9af7be49f8cca967e4f"  # as pipecat-ai/smart-turn v3.2
WINDOW_S = 8  # the model hears the last 8 s, zero-padded in front
INSTALL_HINT = "pip install 'rtc-omni[turn]'"

# One inference at a time, process-wide: the model never takes more than one core.
executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="smart-turn")


class TurnModelUnavailable(RuntimeError):
    """The model file or its runtime is missing or not what was published."""


def model_file() -> Path:
    """The checked model file; TurnModelUnavailable says what is wrong and how to mend it."""
    try:
        files = importlib.metadata.distribution(DISTRIBUTION).files or []
    except importlib.metadata.PackageNotFoundError:
        raise TurnModelUnavailable(f"the end-of-turn model needs the [turn] extra: {INSTALL_HINT}") from None
    entry = next((f for f in files if str(f) == MODEL_FILE), None)
    if entry is None:
        raise TurnModelUnavailable(f"{DISTRIBUTION} holds no {MODEL_FILE}: install {DISTRIBUTION}==1.14.0")
    path = Path(str(entry.locate()))
    if not path.is_file():
        raise TurnModelUnavailable(f"the end-of-turn model {path} is missing: reinstall {INSTALL_HINT}")
    data = path.read_bytes()
    if len(data) != MODEL_BYTES or hashlib.sha256(data).hexdigest() != MODEL_SHA256:
        raise TurnModelUnavailable(f"the end-of-turn model {path} is not Smart Turn v3.2's: reinstall {INSTALL_HINT}")
    if importlib.util.find_spec("onnxruntime") is None:
        raise TurnModelUnavailable(f"the end-of-turn model needs onnxruntime: {INSTALL_HINT}")
    return path


@functools.cache
def unavailable() -> str | None:
    """Why the model cannot run in this process (checked once, ~20 ms), or None when it can."""
    try:
        model_file()
    except TurnModelUnavailable as exc:
        logger.warning("semantic turn detection is off: %s", exc)
        return str(exc)
    return None


@functools.cache
def _session() -> Any:
    """The ONNX session, loaded once per process on one thread."""
    import onnxruntime

    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads = 1
    options.inter_op_num_threads = 1
    options.execution_mode = onnxruntime.ExecutionMode.ORT_SEQUENTIAL
    return onnxruntime.InferenceSession(str(model_file()), sess_options=options, providers=["CPUExecutionProvider"])


def complete_probability(pcm16: bytes) -> float:
    """P(the speaker has finished) for 16 kHz PCM16 that ends where they paused; blocking, so the
    caller runs it on `executor`."""
    features = log_mel(pcm16_to_float(pcm16), WINDOW_S)[np.newaxis]
    (output,) = _session().run(None, {"input_features": features})
    return float(np.asarray(output).reshape(-1)[0])  # the graph ends in a sigmoid
