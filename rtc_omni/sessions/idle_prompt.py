"""Idle prompts: when nobody has spoken for the session's `idle_timeout_ms`, the assistant speaks up.

The clock runs on the microphone's audio timeline (milliseconds of audio heard, the VAD's clock),
so it fires only while the client streams audio, as a voice app does. A silence starts when the
detection is set up, when the user's speech ends, or when the assistant's speech has played out;
it ends when someone speaks. Each silence fires at most once.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class IdleTimeout:
    """Nobody spoke between these two timeline positions, for the whole idle timeout."""

    audio_start_ms: float
    audio_end_ms: float


class IdleClock:
    def __init__(self, timeout_ms: int) -> None:
        self.timeout_ms = timeout_ms
        self._since_ms: float | None = None  # when the current silence started; None while someone speaks

    def start(self, at_ms: float) -> None:
        """A silence starts at this timeline position (it may lie ahead: speech still playing at the client)."""
        self._since_ms = at_ms

    def stop(self) -> None:
        self._since_ms = None

    def check(self, now_ms: float) -> IdleTimeout | None:
        """The timeout, once, when the silence has lasted long enough by `now_ms`."""
        if self._since_ms is None or now_ms - self._since_ms < self.timeout_ms:
            return None
        timeout = IdleTimeout(self._since_ms, now_ms)
        self._since_ms = None
        return timeout
