"""The audio every layer shares: the two rates, PCM16 <-> float, and the microphone buffer's bound.

It imports nothing of the package, so media, engines and sessions all import it and none of them
has to import another for a constant.
"""

from __future__ import annotations

import numpy as np

INPUT_SAMPLE_RATE = 16_000  # the microphone audio a turn carries: what vLLM-Omni's `audio.chunk` holds
TALKER_SAMPLE_RATE = 24_000  # the speech an engine yields
INPUT_BYTES_PER_MS = INPUT_SAMPLE_RATE * 2 // 1000  # PCM16 mono
MAX_AUDIO_BUFFER_BYTES = 4 * 1024 * 1024  # a session's unanswered microphone audio, as vLLM-Omni bounds it


def float_to_pcm16(samples: np.ndarray) -> bytes:
    """Float samples in [-1, 1] as little-endian PCM16 (clipped)."""
    return (np.clip(samples, -1.0, 1.0) * 32767.0).astype("<i2").tobytes()


def pcm16_to_float(pcm16: bytes | np.ndarray) -> np.ndarray:
    """Little-endian PCM16 (bytes, or int16 samples) as float32 in [-1, 1)."""
    samples = np.frombuffer(pcm16, dtype="<i2") if isinstance(pcm16, (bytes, bytearray, memoryview)) else pcm16
    return samples.astype(np.float32) / 32768.0


def pcm16_ms(pcm16: bytes, sample_rate: int) -> float:
    """How long mono PCM16 at `sample_rate` plays, in milliseconds."""
    return len(pcm16) / (sample_rate * 2 / 1000)
