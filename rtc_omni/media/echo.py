"""Echo check: is the microphone just hearing the talker again?

A peer without echo cancellation plays the talker's speech into its own microphone. The talker
records what it sent (downsampled to 16 kHz, with send times); when speech seems to start while
the talker is audible, the recent microphone audio is correlated against that reference over the
plausible round-trip delays. A strong match means echo, which must not interrupt the answer; a
person talking over the answer does not match, because their voice dominates the mix.
"""

from __future__ import annotations

import time
from collections import deque

import numpy as np

from ..engines.base import INPUT_SAMPLE_RATE

KEEP_S = 4.0
# Loopback through a peer's jitter buffers, with room for a loaded machine: 1.5 s was too short
# when the suite's three workers starved the CPU (the echo test was then interrupted by its echo).
MAX_DELAY_S = 3.0
ECHO_CORRELATION = 0.5
_AUDIBLE_RMS = 0.005


class EchoReference:
    """What the talker played in the last couple of seconds, with the time each frame left."""

    def __init__(self) -> None:
        frames = int(KEEP_S * 50)
        self._frames: deque[tuple[float, np.ndarray]] = deque(maxlen=frames)

    def played(self, pcm48_mono: np.ndarray, at: float | None = None) -> None:
        """Record one 20 ms frame of 48 kHz int16 audio as it is handed to the sender."""
        samples = pcm48_mono.astype(np.float32).reshape(-1) / 32768.0
        usable = samples[: samples.size - samples.size % 3]
        self._frames.append((time.monotonic() if at is None else at, usable.reshape(-1, 3).mean(axis=1)))

    def audible_since(self, since: float) -> bool:
        return any(at >= since and float(np.sqrt(np.mean(x * x))) > _AUDIBLE_RMS for at, x in self._frames)

    def is_echo(self, mic: np.ndarray, mic_end_at: float) -> bool:
        """Whether 16 kHz float `mic` audio, ending at `mic_end_at`, is mostly the talker's sound."""
        window_start = mic_end_at - mic.size / INPUT_SAMPLE_RATE - MAX_DELAY_S
        parts = [x for at, x in self._frames if at >= window_start - 0.02 and at <= mic_end_at]
        if not parts or mic.size == 0:
            return False
        reference = np.concatenate(parts)
        if reference.size < mic.size or float(np.sqrt(np.mean(reference * reference))) < _AUDIBLE_RMS:
            return False
        return max_normalised_correlation(reference, mic) >= ECHO_CORRELATION


def max_normalised_correlation(reference: np.ndarray, probe: np.ndarray) -> float:
    """Best normalised cross-correlation of `probe` against every position in `reference`."""
    n = reference.size + probe.size
    size = 1 << (n - 1).bit_length()
    spectrum = np.fft.rfft(reference, size) * np.conj(np.fft.rfft(probe, size))
    correlation = np.fft.irfft(spectrum, size)[: reference.size - probe.size + 1]
    energy = np.concatenate([[0.0], np.cumsum(reference.astype(np.float64) ** 2)])
    window_energy = energy[probe.size :] - energy[: -probe.size]
    norm = np.sqrt(np.maximum(window_energy[: correlation.size], 1e-12) * float(np.sum(probe**2)) + 1e-12)
    return float(np.max(np.abs(correlation) / norm))
