"""Server-side voice activity detection on the 16 kHz ingest audio.

WebRTC's VAD (webrtcvad-wheels) decides frame by frame whether a 20 ms frame sounds like speech,
but it also fires on steady noise and tones. Two checks keep those out: a frame must stand above
an adaptive noise floor (the per-second minimum of recent energy), and a finished segment must
vary in loudness the way syllables do. Segments start once 5 of the last 8 frames (160 ms) are voiced and
end after `silence_duration_ms` of unvoiced frames. Positions are milliseconds of audio fed.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

import numpy as np
import webrtcvad

from ..pcm import INPUT_SAMPLE_RATE, pcm16_to_float

FRAME_MS = 20
FRAME_SAMPLES = INPUT_SAMPLE_RATE * FRAME_MS // 1000
_FRAME_BYTES = FRAME_SAMPLES * 2
START_WINDOW_FRAMES = 8  # 160 ms
START_VOICED_FRAMES = 5
FLOOR_WINDOW_FRAMES = 50  # 1 s of history for the noise floor
MIN_SEGMENT_MS = 200
MIN_LOUDNESS_SPREAD_DB = 3.0  # syllables rise and fall; steady noise does not
_SILENCE_DBFS = -55.0
_EPS = 1e-10


@dataclass(frozen=True)
class SpeechStarted:
    audio_start_ms: float


@dataclass(frozen=True)
class SpeechStopped:
    audio_start_ms: float
    audio_end_ms: float
    is_speech: bool  # False when the segment was too short or too steady to be a voice

    @property
    def duration_ms(self) -> float:
        return self.audio_end_ms - self.audio_start_ms


VadEvent = SpeechStarted | SpeechStopped


def _frame_db(energy: float) -> float:
    return 10.0 * float(np.log10(energy + _EPS))


class VoiceActivityDetector:
    """Turns a stream of PCM16 into speech start and stop events."""

    def __init__(self, threshold: float = 0.5, silence_duration_ms: int = 500) -> None:
        # threshold 0..1 maps to webrtcvad's aggressiveness and to the SNR a frame needs.
        self._vad = webrtcvad.Vad(min(3, int(threshold * 4)))
        self.snr_gate_db = 4.0 + 8.0 * threshold
        self.silence_frames = max(1, silence_duration_ms // FRAME_MS)
        self.position_ms = 0.0
        self._pending = b""
        self._energies: deque[float] = deque(maxlen=FLOOR_WINDOW_FRAMES)
        self._window: deque[tuple[bool, float]] = deque(maxlen=START_WINDOW_FRAMES)  # (voiced, start ms)
        self._segment_start: float | None = None
        self._segment_db: list[float] = []
        self._last_voiced_end = 0.0
        self._unvoiced_run = 0

    @property
    def in_speech(self) -> bool:
        return self._segment_start is not None

    @property
    def last_voiced_ms(self) -> float:
        """Where the last voiced frame of the current segment ended."""
        return self._last_voiced_end

    @property
    def quiet_ms(self) -> float:
        """How long the current segment has been unvoiced (0 while the voice goes on)."""
        return self._unvoiced_run * FRAME_MS

    def feed(self, pcm16: bytes) -> list[VadEvent]:
        """Consume audio; returns the events it completed, in order."""
        data = self._pending + pcm16
        whole = len(data) - len(data) % _FRAME_BYTES
        self._pending = data[whole:]
        events: list[VadEvent] = []
        for offset in range(0, whole, _FRAME_BYTES):
            event = self._frame(data[offset : offset + _FRAME_BYTES])
            if event is not None:
                events.append(event)
        return events

    def _voiced(self, frame: bytes) -> tuple[bool, float]:
        samples = pcm16_to_float(frame)
        energy = float(np.mean(samples * samples))
        self._energies.append(energy)
        floor = min(self._energies)
        db = _frame_db(energy)
        loud = db > _SILENCE_DBFS and db - _frame_db(floor) >= self.snr_gate_db
        return loud and self._vad.is_speech(frame, INPUT_SAMPLE_RATE), db

    def _frame(self, frame: bytes) -> VadEvent | None:
        start_ms = self.position_ms
        self.position_ms += FRAME_MS
        voiced, db = self._voiced(frame)
        if self._segment_start is None:
            self._window.append((voiced, start_ms))
            if sum(v for v, _ in self._window) >= START_VOICED_FRAMES:
                self._segment_start = next(at for v, at in self._window if v)
                self._segment_db = [db]
                self._last_voiced_end = self.position_ms
                self._unvoiced_run = 0
                self._window.clear()
                return SpeechStarted(self._segment_start)
            return None
        self._segment_db.append(db)
        if voiced:
            self._last_voiced_end = self.position_ms
            self._unvoiced_run = 0
            return None
        self._unvoiced_run += 1
        if self._unvoiced_run < self.silence_frames:
            return None
        start, end = self._segment_start, self._last_voiced_end
        spoken = self._segment_db[: max(1, len(self._segment_db) - self._unvoiced_run)]
        is_speech = end - start >= MIN_SEGMENT_MS and float(np.std(spoken)) >= MIN_LOUDNESS_SPREAD_DB
        self._segment_start = None
        self._segment_db = []
        return SpeechStopped(start, end, is_speech)
