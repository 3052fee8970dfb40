"""The session's microphone buffer: bounded 16 kHz PCM16 that knows its place on the audio timeline.

The timeline counts milliseconds of audio ever appended to the session, the same clock the VAD
reports speech on, so a speech segment can be cut out of the buffer by its start and end.
"""

from __future__ import annotations

from ..pcm import INPUT_BYTES_PER_MS


class AudioBuffer:
    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self._data = bytearray()
        self._appended = 0  # bytes ever appended

    def __len__(self) -> int:
        return len(self._data)

    @property
    def duration_ms(self) -> float:
        return len(self._data) / INPUT_BYTES_PER_MS

    @property
    def start_ms(self) -> float:
        """Timeline position of the oldest byte held."""
        return (self._appended - len(self._data)) / INPUT_BYTES_PER_MS

    @property
    def end_ms(self) -> float:
        """Timeline position just after the newest byte."""
        return self._appended / INPUT_BYTES_PER_MS

    def append(self, pcm16: bytes) -> bool:
        """Add audio; False when it would overflow, in which case everything held is dropped
        (vLLM-Omni's policy) and so is the new audio."""
        self._appended += len(pcm16)
        if len(self._data) + len(pcm16) > self.max_bytes:
            self._data.clear()
            return False
        self._data.extend(pcm16)
        return True

    def take_all(self) -> bytes:
        audio = bytes(self._data)
        self._data.clear()
        return audio

    def read_range(self, start_ms: float, end_ms: float) -> bytes:
        """The audio held between two timeline positions, left in place."""
        return bytes(self._data[self._offset(start_ms) : self._offset(end_ms)])

    def take_range(self, start_ms: float, end_ms: float) -> bytes:
        """The audio between two timeline positions; everything before `end_ms` is dropped."""
        audio = self.read_range(start_ms, end_ms)
        self.drop_until(end_ms)
        return audio

    def drop_until(self, end_ms: float) -> None:
        del self._data[: self._offset(end_ms)]

    def _offset(self, at_ms: float) -> int:
        offset = int(round((at_ms - self.start_ms) * INPUT_BYTES_PER_MS))
        offset -= offset % 2
        return max(0, min(len(self._data), offset))

    def clear(self) -> None:
        self._data.clear()
