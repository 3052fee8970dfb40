"""Whisper's log-mel spectrogram of a fixed window of 16 kHz audio, in numpy alone.

The end-of-turn model (engines/smart_turn.py) is Whisper-tiny's encoder with a classifier on top,
so it reads what Whisper's feature extractor writes: 80 Slaney mel bands of 25 ms Hann frames every
10 ms, log10, clipped 8 decades below the loudest, scaled to about [-1, 1]. Written here rather than
imported, so the model needs neither transformers nor faster-whisper.
"""

from __future__ import annotations

import functools

import numpy as np

from ..pcm import INPUT_SAMPLE_RATE

N_FFT = 400  # 25 ms
HOP = 160  # 10 ms
N_MELS = 80
_LOG_FLOOR = 1e-10
_NORMALISE_EPS = 1e-7


def _hz_to_mel(hz: np.ndarray) -> np.ndarray:
    """Slaney's mel scale: linear to 1 kHz, logarithmic above."""
    linear = hz * 3.0 / 200.0
    log = 15.0 + np.log(np.maximum(hz, 1e-9) / 1000.0) * 27.0 / np.log(6.4)
    return np.where(hz < 1000.0, linear, log)


def _mel_to_hz(mel: np.ndarray) -> np.ndarray:
    linear = mel * 200.0 / 3.0
    log = 1000.0 * np.exp((mel - 15.0) * np.log(6.4) / 27.0)
    return np.where(mel < 15.0, linear, log)


@functools.cache
def mel_filters() -> np.ndarray:
    """(N_MELS, N_FFT // 2 + 1) triangles from 0 Hz to Nyquist, each of unit area (Slaney)."""
    edges = _mel_to_hz(np.linspace(0.0, _hz_to_mel(np.array(INPUT_SAMPLE_RATE / 2)), N_MELS + 2))
    bins = np.linspace(0.0, INPUT_SAMPLE_RATE / 2, N_FFT // 2 + 1)
    low, centre, high = edges[:-2, None], edges[1:-1, None], edges[2:, None]
    rising = (bins - low) / (centre - low)
    falling = (high - bins) / (high - centre)
    triangles = np.maximum(0.0, np.minimum(rising, falling))
    return triangles * (2.0 / (high - low))


@functools.cache
def _bands() -> tuple[tuple[int, int, np.ndarray], ...]:
    """Each mel filter as the span of FFT bins where it is non-zero, and its weights there."""
    spans = []
    for weights in mel_filters():
        bins = np.flatnonzero(weights)
        spans.append((int(bins[0]), int(bins[-1]) + 1, weights[bins[0] : bins[-1] + 1]))
    return tuple(spans)


def _mel(power: np.ndarray) -> np.ndarray:
    """(N_MELS, frames) from (frames, bins) power, band by band: as one matrix product, BLAS
    threads spin beside the model's run and double the CPU an inference costs."""
    return np.stack([(power[:, first:end] * weights).sum(axis=1) for first, end, weights in _bands()])


@functools.cache
def _window() -> np.ndarray:
    return np.hanning(N_FFT + 1)[:-1]  # periodic, as torch.hann_window


def log_mel(samples: np.ndarray, seconds: int) -> np.ndarray:
    """(N_MELS, seconds * 100) float32 features of the last `seconds` of `samples` (float, 16 kHz),
    zero-padded in front when shorter; the waveform is first scaled to zero mean and unit variance."""
    length = seconds * INPUT_SAMPLE_RATE
    audio = np.zeros(length, dtype=np.float32)
    tail = np.asarray(samples, dtype=np.float32)[-length:]
    audio[length - tail.size :] = tail
    audio = (audio - audio.mean()) / np.sqrt(audio.var() + _NORMALISE_EPS)
    padded = np.pad(audio.astype(np.float64), N_FFT // 2, mode="reflect")
    frames = np.lib.stride_tricks.sliding_window_view(padded, N_FFT)[::HOP][:-1]  # the last frame is dropped
    power = np.abs(np.fft.rfft(frames * _window(), axis=-1)) ** 2
    log_spec = np.log10(np.maximum(_mel(power), _LOG_FLOOR))
    log_spec = np.maximum(log_spec, log_spec.max() - 8.0)
    return ((log_spec + 4.0) / 4.0).astype(np.float32)
