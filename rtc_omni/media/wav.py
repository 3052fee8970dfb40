"""WAV as the protocols carry it: base64 of a whole mono PCM16 file."""

from __future__ import annotations

import base64
import io
import wave


def wav_base64(pcm16: bytes, sample_rate: int) -> str:
    """Base64 of a mono 16-bit WAV file holding `pcm16`."""
    out = io.BytesIO()
    with wave.open(out, "wb") as wav:
        wav.setnchannels(1)
        wav.setsampwidth(2)
        wav.setframerate(sample_rate)
        wav.writeframes(pcm16)
    return base64.b64encode(out.getvalue()).decode("ascii")
