"""WAV as the protocols carry it: base64 of a whole mono PCM16 file."""

from __future__ import annotations

import base64
import io
import wave

import numpy as np


def wav_base64(pcm16: bytes, sample_rate: int) -> str:
    """Base64 of a mono 16-bit WAV file holding `pcm16`."""
    out = io.BytesIO()
    with wave.open(out, "wb") as wav:
        wav.setnchannels(1)
        wav.setsampwidth(2)
        wav.setframerate(sample_rate)
        wav.writeframes(pcm16)
    return base64.b64encode(out.getvalue()).decode("ascii")


def float_to_pcm16(samples: np.ndarray) -> bytes:
    """Float samples in [-1, 1] as little-endian PCM16 (clipped)."""
    return (np.clip(samples, -1.0, 1.0) * 32767.0).astype("<i2").tobytes()
