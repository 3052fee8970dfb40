"""Server turn detection: speech start and stop from the microphone, with echo kept out.

Wraps the VAD (media/vad.py) with the session's policy: a segment that starts while the talker is
audible and matches what it played (media/echo.py) is the talker's own echo and is ignored; it is
checked again every 100 ms, so a person who starts talking over the echo is still heard.

Within a segment it also says when the voice has lasted `min_interruption_ms` (SpeechLasted: a
barge-in is speech, not a cough), when it goes quiet (VoicePaused) and when it comes back
(VoiceResumed), so an answer held at the segment's start can be cancelled or resumed long before
the segment's trailing silence ends it.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Literal

import numpy as np

from ..config import DEFAULT_MIN_INTERRUPTION_MS
from ..media.echo import MAX_DELAY_S, EchoReference
from ..media.vad import SpeechStarted, SpeechStopped, VoiceActivityDetector
from ..pcm import pcm16_to_float
from ..protocol.realtime_events import TurnDetectionConfig
from ..protocol.understand_messages import TurnDetection

ECHO_PROBE_MS = 300
ECHO_RECHECK_MS = 100
QUIET_RMS = 0.005
VOICE_PAUSE_MS = 40  # unvoiced frames in a row that end a burst (two 20 ms frames)


Eagerness = Literal["low", "medium", "high", "auto"]

# By eagerness ("auto" is "medium", as OpenAI's): the pause that asks the model, the probability
# of a finished turn that ends it there, and the cap after which a turn ends whatever the model said
# (OpenAI's semantic_vad maxima).
PAUSE_MS = {"low": 500, "medium": 300, "high": 200}
THRESHOLD = {"low": 0.7, "medium": 0.5, "high": 0.4}
CAP_MS = {"low": 8000, "medium": 4000, "high": 2000}
# Without the model, semantic_vad is server_vad with this silence (what it was before the model).
FALLBACK_SILENCE_MS = {"low": 1000, "medium": 600, "high": 350}


@dataclass(frozen=True)
class Semantic:
    """Semantic turn detection's setting, OpenAI's `eagerness`."""

    eagerness: Eagerness = "auto"

    @property
    def level(self) -> Literal["low", "medium", "high"]:
        return "medium" if self.eagerness == "auto" else self.eagerness

    @property
    def pause_ms(self) -> int:
        return PAUSE_MS[self.level]

    @property
    def threshold(self) -> float:
        return THRESHOLD[self.level]

    @property
    def cap_ms(self) -> int:
        return CAP_MS[self.level]


@dataclass(frozen=True)
class VadSettings:
    """Server turn detection's settings, whichever protocol set them (OpenAI's names and defaults)."""

    threshold: float = 0.5
    prefix_padding_ms: int = 300
    silence_ms: int = 500
    interrupt_response: bool = True
    min_interruption_ms: int = DEFAULT_MIN_INTERRUPTION_MS  # voice this long over an answer cancels it
    idle_timeout_ms: int | None = None  # prompt the user after this much silence (idle_prompt.py)
    semantic: Semantic | None = None  # the end-of-turn model judges each pause (end_of_turn.py)

    @property
    def pause_ms(self) -> int:
        """The silence after which the VAD reports a pause."""
        return self.semantic.pause_ms if self.semantic is not None else self.silence_ms


def vad_settings(detection: TurnDetectionConfig | TurnDetection | None, min_interruption_ms: int) -> VadSettings | None:
    """The listening path's settings for either protocol's config, both in OpenAI's names (None: none);
    a legacy config's own `min_interruption_ms` beats the server's."""
    if detection is None:
        return None
    own = detection.min_interruption_ms if isinstance(detection, TurnDetection) else None
    return VadSettings(
        detection.threshold,
        detection.prefix_padding_ms,
        detection.silence_duration_ms,
        detection.interrupt_response,
        min_interruption_ms if own is None else own,
        detection.idle_timeout_ms,
        Semantic(detection.eagerness) if detection.type == "semantic_vad" else None,
    )


@dataclass(frozen=True)
class EchoIgnored:
    """A segment that was only the talker's echo ended; its audio is of no use."""

    audio_end_ms: float


@dataclass(frozen=True)
class SpeechLasted:
    """The segment's voice has lasted `min_interruption_ms`: it is speech, whatever follows."""

    audio_start_ms: float


@dataclass(frozen=True)
class VoicePaused:
    """The segment's voice stopped (VOICE_PAUSE_MS unvoiced); the segment may still go on."""

    audio_end_ms: float


@dataclass(frozen=True)
class VoiceResumed:
    """The segment's voice came back after a VoicePaused."""

    audio_start_ms: float


TurnTakingEvent = SpeechStarted | SpeechStopped | EchoIgnored | SpeechLasted | VoicePaused | VoiceResumed


class ServerVad:
    """Feeds the VAD and filters its segments through the echo check."""

    def __init__(self, config: VadSettings, echo: EchoReference | None) -> None:
        self.config = config
        self.echo = echo
        self.vad = VoiceActivityDetector(config.threshold, config.pause_ms)
        self._recent = bytearray()  # the last ECHO_PROBE_MS of microphone audio
        self._echo_segment = False
        self._next_recheck_ms = 0.0
        self._started_ms = 0.0  # where the reported segment began (later than the VAD's after echo)
        self._lasted = False  # SpeechLasted was reported for this segment
        self._quiet = False  # VoicePaused was reported for the current unvoiced run

    def feed(self, pcm16: bytes) -> list[TurnTakingEvent]:
        self._recent.extend(pcm16)
        del self._recent[: max(0, len(self._recent) - ECHO_PROBE_MS * 32)]
        events: list[TurnTakingEvent] = []
        for event in self.vad.feed(pcm16):
            if isinstance(event, SpeechStarted):
                if self._sounds_like_echo():
                    self._echo_segment = True
                    self._next_recheck_ms = self.vad.position_ms + ECHO_RECHECK_MS
                else:
                    self._start_segment(event.audio_start_ms)
                    events.append(event)
            elif self._echo_segment:
                self._echo_segment = False
                events.append(EchoIgnored(event.audio_end_ms))
            else:
                is_speech = event.is_speech and event.audio_end_ms > self._started_ms
                events.append(SpeechStopped(self._started_ms, event.audio_end_ms, is_speech))
        if self._echo_segment and self.vad.in_speech and self.vad.position_ms >= self._next_recheck_ms:
            self._next_recheck_ms = self.vad.position_ms + ECHO_RECHECK_MS
            if not self._sounds_like_echo():  # someone is talking over the echo
                self._echo_segment = False
                self._start_segment(max(0.0, self.vad.position_ms - ECHO_PROBE_MS))
                events.append(SpeechStarted(self._started_ms))
        if self.vad.in_speech and not self._echo_segment:
            events += self._progress()
        return events

    def _start_segment(self, audio_start_ms: float) -> None:
        self._started_ms = audio_start_ms
        self._lasted = self._quiet = False

    def _progress(self) -> list[TurnTakingEvent]:
        """SpeechLasted once per segment; VoicePaused once per unvoiced run, VoiceResumed after it."""
        events: list[TurnTakingEvent] = []
        if not self._lasted and self.vad.last_voiced_ms - self._started_ms >= self.config.min_interruption_ms:
            self._lasted = True
            events.append(SpeechLasted(self._started_ms))
        if self.vad.quiet_ms == 0 and self._quiet:
            self._quiet = False
            events.append(VoiceResumed(self.vad.last_voiced_ms))
        elif self.vad.quiet_ms >= VOICE_PAUSE_MS and not self._quiet:
            self._quiet = True
            events.append(VoicePaused(self.vad.last_voiced_ms))
        return events

    def _sounds_like_echo(self) -> bool:
        if self.echo is None:
            return False
        now = time.monotonic()
        if not self.echo.audible_since(now - MAX_DELAY_S - ECHO_PROBE_MS / 1000):
            return False
        mic = pcm16_to_float(bytes(self._recent))
        if float(np.sqrt(np.mean(mic * mic))) < QUIET_RMS:
            return True  # a pause inside an echo segment: nothing new to hear yet
        return self.echo.is_echo(mic, now)
