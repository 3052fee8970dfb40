"""PCM16 mono from one rate to another, as a stream: the realtime protocol's 24 kHz in and out.

A stream keeps its resampler between calls so chunk boundaries leave no clicks; `convert` is the
one-shot form for a whole clip (an `input_audio` item).
"""

from __future__ import annotations

import av
import numpy as np


class PcmStream:
    """Little-endian PCM16 mono at `source_rate` in, at `target_rate` out."""

    def __init__(self, source_rate: int, target_rate: int) -> None:
        self.source_rate = source_rate
        self._resampler = av.AudioResampler(format="s16", layout="mono", rate=target_rate)

    def feed(self, pcm16: bytes) -> bytes:
        if not pcm16:
            return b""
        samples = np.frombuffer(pcm16, dtype="<i2").reshape(1, -1)
        frame = av.AudioFrame.from_ndarray(samples, format="s16", layout="mono")
        frame.sample_rate = self.source_rate
        return b"".join(out.to_ndarray().astype("<i2").tobytes() for out in self._resampler.resample(frame))

    def flush(self) -> bytes:
        return b"".join(out.to_ndarray().astype("<i2").tobytes() for out in self._resampler.resample(None))


def convert(pcm16: bytes, source_rate: int, target_rate: int) -> bytes:
    """A whole clip at another rate."""
    stream = PcmStream(source_rate, target_rate)
    return stream.feed(pcm16) + stream.flush()
