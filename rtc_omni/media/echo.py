"""Echo check: is the microphone just hearing the talker again?

A peer without echo cancellation plays the talker's speech into its own microphone. The talker
records each voiced packet it sends (downsampled to 16 kHz, with its send time and RTP timestamp); when speech seems
to start while the talker is audible, the recent microphone audio is correlated against that
reference over the plausible round-trip delays. A strong match means echo, which must not interrupt the answer; a
person talking over the answer does not match, because their voice dominates the mix.
"""

from __future__ import annotations

import time
from collections import deque

import numpy as np

from ..pcm import INPUT_SAMPLE_RATE, pcm16_to_float

KEEP_S = 4.0
# Loopback through a peer's jitter buffers, with room for a loaded machine: 1.5 s was too short
# when the suite's three workers starved the CPU (the echo test was then interrupted by its echo).
MAX_DELAY_S = 3.0
ECHO_CORRELATION = 0.5
_AUDIBLE_RMS = 0.005
_RTP_CLOCK = 48_000


class EchoReference:
    """What the talker played in the last few seconds: each voiced packet, when it left and where it
    lies in the stream.

    `is_echo` lays the packets out by their stream position (RTP timestamp), silent in the pauses,
    not by send time: a starved loop sends packets late and in bunches, but the peer plays them
    one after the other.
    """

    def __init__(self) -> None:
        packets = int(KEEP_S * 50)  # 20 ms packets, the shortest the talker sends
        self._packets: deque[tuple[float, int, np.ndarray]] = deque(maxlen=packets)

    def played(self, pcm24_mono: np.ndarray, position: int, at: float | None = None) -> None:
        """Record one packet of 24 kHz int16 audio (a multiple of 3 samples) as it leaves;
        `position` is its RTP timestamp (48 kHz)."""
        triples = pcm16_to_float(pcm24_mono).reshape(-1, 3)
        # 24 kHz -> 16 kHz: two outputs per three inputs, at input positions 0 and 1.5
        pcm16k = np.empty(triples.shape[0] * 2, dtype=np.float32)
        pcm16k[0::2] = triples[:, 0]
        pcm16k[1::2] = (triples[:, 1] + triples[:, 2]) / 2
        sent_at = time.monotonic() if at is None else at
        self._packets.append((sent_at, position, pcm16k))
        # The count bound assumes 20 ms packets; at 120 ms it would keep 24 s (1.5 MB), not KEEP_S.
        while self._packets and self._packets[0][0] < sent_at - KEEP_S:
            self._packets.popleft()

    def audible_since(self, since: float) -> bool:
        return any(at >= since and float(np.sqrt(np.mean(x * x))) > _AUDIBLE_RMS for at, _, x in self._packets)

    def is_echo(self, mic: np.ndarray, mic_end_at: float) -> bool:
        """Whether 16 kHz float `mic` audio, ending at `mic_end_at`, is mostly the talker's sound."""
        window_start = mic_end_at - mic.size / INPUT_SAMPLE_RATE - MAX_DELAY_S
        parts = [(at, position, x) for at, position, x in self._packets if window_start - 0.06 <= at <= mic_end_at]
        if not parts or mic.size == 0:
            return False
        # The whole window, silent where nothing was played: just after the talker starts, its few
        # packets are shorter than the mic audio, and the echo still lies in the window.
        first_at, first_position, _ = parts[0]
        lead = max(0, round((first_at - window_start) * INPUT_SAMPLE_RATE))
        offsets = [lead + (position - first_position) * INPUT_SAMPLE_RATE // _RTP_CLOCK for _, position, _ in parts]
        length = max(round((mic_end_at - window_start) * INPUT_SAMPLE_RATE), offsets[-1] + parts[-1][2].size)
        reference = np.zeros(length, dtype=np.float32)
        for offset, (_, _, x) in zip(offsets, parts):
            reference[offset : offset + x.size] = x
        if reference.size < mic.size or float(np.sqrt(np.mean(reference * reference))) < _AUDIBLE_RMS:
            return False
        return max_normalised_correlation(reference, mic) >= ECHO_CORRELATION


def max_normalised_correlation(reference: np.ndarray, probe: np.ndarray) -> float:
    """Best normalised cross-correlation of `probe` against every position in `reference` where
    the reference is audible (in silence the ratio is rounding noise over nothing, and can pass 1)."""
    reference, probe = reference.astype(np.float64), probe.astype(np.float64)
    n = reference.size + probe.size
    size = 1 << (n - 1).bit_length()
    spectrum = np.fft.rfft(reference, size) * np.conj(np.fft.rfft(probe, size))
    correlation = np.fft.irfft(spectrum, size)[: reference.size - probe.size + 1]
    energy = np.concatenate([[0.0], np.cumsum(reference**2)])
    window_energy = (energy[probe.size :] - energy[: -probe.size])[: correlation.size]
    audible = window_energy >= _AUDIBLE_RMS**2 * probe.size
    probe_energy = float(np.sum(probe**2))
    if not audible.any() or probe_energy == 0.0:
        return 0.0
    return float(np.max(np.abs(correlation[audible]) / np.sqrt(window_energy[audible] * probe_energy)))
