"""One listening path for every conversational session: the microphone's 16 kHz PCM16 into the
session's audio buffer and, with turn detection on, through the server VAD and its echo check,
and with semantic turn detection through the end-of-turn model (end_of_turn.py).

What the VAD hears is queued as work in the session's inbox (`Heard`), in order with the client's
messages, the same way for every session kind; the session's loop then asks this path what the
event means: a barge-in, an utterance to answer, or noise and echo to forget.

A barge-in is judged before it cancels anything (`barge_in`): voice over an answer holds the
answer's speech at once; voice that lasts `min_interruption_ms` cancels it; voice that stops sooner
(a cough, a click, a short "mm") releases it where it stopped, and that segment is no turn unless
the voice comes back (held again) and lasts.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

from .. import metrics
from ..media.echo import EchoReference
from ..media.vad import SpeechStarted, SpeechStopped
from ..pcm import INPUT_BYTES_PER_MS, MAX_AUDIO_BUFFER_BYTES
from .audio_buffer import AudioBuffer
from .end_of_turn import EndOfTurn, Spawn
from .inbox import WorkItem
from .turn_taking import EchoIgnored, ServerVad, SpeechLasted, TurnTakingEvent, VadSettings, VoicePaused, VoiceResumed

BargeIn = Literal["hold", "release", "interrupt"]


@dataclass(frozen=True)
class Heard(WorkItem):
    """The server VAD heard speech start or stop, or the talker's echo end."""

    name = "turn_taking"
    event: TurnTakingEvent


class Listening:
    """The session's microphone buffer and, when turn detection is on, its server VAD."""

    def __init__(self, queue_work: Callable[[WorkItem], None], spawn: Spawn) -> None:
        self.audio = AudioBuffer(MAX_AUDIO_BUFFER_BYTES)
        self.detection: VadSettings | None = None
        self._vad: ServerVad | None = None
        self._end_of_turn: EndOfTurn | None = None
        self._queue_work = queue_work
        self._spawn = spawn
        self._barge: Literal["none", "judging", "false"] = "none"  # the current segment over an answer

    def detect(self, detection: VadSettings | None, echo: EchoReference | None) -> None:
        """Turn detection with these settings from now on (a fresh VAD and no open turn), or none."""
        self.detection = detection
        self._vad = ServerVad(detection, echo) if detection is not None else None
        if self._end_of_turn is not None:
            self._end_of_turn.close()
        self._end_of_turn = None
        if detection is not None and detection.semantic is not None:
            self._end_of_turn = EndOfTurn(
                detection.semantic,
                self.audio,
                detection.prefix_padding_ms,
                lambda speech: self._queue_work(Heard(speech)),
                self._spawn,
            )
        self._barge = "none"

    def hear(self, pcm16: bytes) -> bool:
        """Buffer 16 kHz audio and listen to it; False when the buffer overflowed (and was emptied)."""
        metrics.AUDIO_MS_IN.inc(len(pcm16) / INPUT_BYTES_PER_MS)
        kept = self.audio.append(pcm16)
        if self._vad is not None:
            for event in self._vad.feed(pcm16):
                if self._end_of_turn is None or self._end_of_turn.hear(event):
                    self._queue_work(Heard(event))
            if self._end_of_turn is not None:
                self._end_of_turn.heard_until(self._vad.vad.position_ms)
        return kept

    def barge_in(self, event: TurnTakingEvent, answering: bool) -> BargeIn | None:
        """What `event` does to the answer in progress (`answering`): hold its speech while the
        voice is judged, release it (no speech), interrupt it (speech); None: nothing."""
        if isinstance(event, SpeechStarted):
            interrupts = self.detection is not None and self.detection.interrupt_response
            self._barge = "judging" if interrupts and answering else "none"
            return "hold" if self._barge == "judging" else None
        if isinstance(event, SpeechLasted) and self._barge != "none":
            self._barge = "none"  # speech: the segment is a turn like any other
            return "interrupt"
        if isinstance(event, VoicePaused) and self._barge == "judging":
            self._barge = "false"
            return "release"
        if isinstance(event, VoiceResumed) and self._barge == "false":
            self._barge = "judging"
            return "hold"
        return None

    def utterance(self, event: TurnTakingEvent) -> bytes | None:
        """At the end of speech, the utterance with its prefix padding, taken out of the buffer;
        None for anything else, and the audio of noise or of the talker's echo is forgotten."""
        if not isinstance(event, SpeechStopped | EchoIgnored) or self.detection is None:
            return None
        false_barge_in, self._barge = self._barge == "false", "none"
        if isinstance(event, SpeechStopped) and event.is_speech and not false_barge_in:
            return self.audio.take_range(event.audio_start_ms - self.detection.prefix_padding_ms, event.audio_end_ms)
        self.audio.drop_until(event.audio_end_ms)
        return None
