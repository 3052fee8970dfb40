"""The talker: the live outgoing audio track that speaks the model's answer.

The engine's 24 kHz float audio is resampled once to 48 kHz PCM16 and held in a bounded buffer;
`recv()` hands aiortc exactly one 20 ms frame per 20 ms of wall time (silence when there is nothing
to say), so at most one frame sits inside aiortc and `flush()` silences the talker at once.
"""

from __future__ import annotations

import asyncio
import fractions
import time

import av
import numpy as np
from aiortc.mediastreams import MediaStreamError, MediaStreamTrack

from ..engines.base import TALKER_SAMPLE_RATE
from .echo import EchoReference

SAMPLE_RATE = 48_000
FRAME_SAMPLES = 960  # 20 ms
_BYTES_PER_SAMPLE = 2
_FRAME_BYTES = FRAME_SAMPLES * _BYTES_PER_SAMPLE
_REANCHOR_AFTER_S = 0.2  # behind the clock by more than this: restart the clock instead of bursting
_TIME_BASE = fractions.Fraction(1, SAMPLE_RATE)


class TalkerAudioTrack(MediaStreamTrack):
    """An Opus-bound audio track fed by the engine, paced in real time."""

    kind = "audio"

    def __init__(self, max_buffer_s: float = 30.0, write_timeout_s: float = 60.0) -> None:
        super().__init__()
        self.max_buffer_bytes = int(max_buffer_s * SAMPLE_RATE) * _BYTES_PER_SAMPLE
        self.write_timeout_s = write_timeout_s
        self._buffer = bytearray()
        self._resampler = self._new_resampler()
        self._space = asyncio.Event()
        self._space.set()
        self._drained = asyncio.Event()
        self._drained.set()
        self._start: float | None = None
        self._timestamp = 0
        self.frames_sent = 0
        self.voiced_frames_sent = 0  # frames that carried the engine's audio, not padding silence
        self.echo = EchoReference()

    @staticmethod
    def _new_resampler() -> av.AudioResampler:
        return av.AudioResampler(format="s16", layout="mono", rate=SAMPLE_RATE)

    @property
    def speaking(self) -> bool:
        """Engine audio is waiting to be sent."""
        return bool(self._buffer)

    @property
    def buffered_ms(self) -> float:
        return len(self._buffer) / _BYTES_PER_SAMPLE / SAMPLE_RATE * 1000.0

    async def write(self, samples: np.ndarray) -> None:
        """Queue 24 kHz float mono audio; waits (bounded) while the buffer is full."""
        if samples.size == 0:
            return
        frame = av.AudioFrame.from_ndarray(
            np.ascontiguousarray(samples, dtype=np.float32).reshape(1, -1), format="flt", layout="mono"
        )
        frame.sample_rate = TALKER_SAMPLE_RATE
        pcm = b"".join(out.to_ndarray().tobytes() for out in self._resampler.resample(frame))
        async with asyncio.timeout(self.write_timeout_s):
            while len(self._buffer) >= self.max_buffer_bytes:
                self._space.clear()
                await self._space.wait()
        self._buffer.extend(pcm)
        if self._buffer:
            self._drained.clear()

    def flush(self) -> float:
        """Drop everything not yet sent; returns the milliseconds of audio dropped."""
        dropped_ms = self.buffered_ms
        self._buffer.clear()
        self._resampler = self._new_resampler()
        self._space.set()
        self._drained.set()
        return dropped_ms

    async def wait_drained(self, timeout: float) -> bool:
        """Wait until everything queued has been handed to the sender; False on timeout."""
        try:
            async with asyncio.timeout(timeout):
                await self._drained.wait()
            return True
        except TimeoutError:
            return False

    async def recv(self) -> av.AudioFrame:
        if self.readyState != "live":
            raise MediaStreamError
        now = time.monotonic()
        if self._start is None:
            self._start = now
        else:
            self._timestamp += FRAME_SAMPLES
            wait = self._start + self._timestamp / SAMPLE_RATE - now
            if wait > 0:
                await asyncio.sleep(wait)
            elif wait < -_REANCHOR_AFTER_S:
                self._start = now - self._timestamp / SAMPLE_RATE

        chunk = bytes(self._buffer[:_FRAME_BYTES])
        del self._buffer[:_FRAME_BYTES]
        if chunk:
            self.voiced_frames_sent += 1
            if len(self._buffer) < self.max_buffer_bytes:
                self._space.set()
            if not self._buffer:
                self._drained.set()
        pcm = chunk + bytes(_FRAME_BYTES - len(chunk))
        samples = np.frombuffer(pcm, dtype=np.int16)
        self.echo.played(samples)
        frame = av.AudioFrame.from_ndarray(samples.reshape(1, -1), format="s16", layout="mono")
        frame.sample_rate = SAMPLE_RATE
        frame.pts = self._timestamp
        frame.time_base = _TIME_BASE
        self.frames_sent += 1
        return frame

    def stop(self) -> None:
        self.flush()
        super().stop()
