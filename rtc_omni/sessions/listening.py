"""One listening path for every conversational session: the microphone's 16 kHz PCM16, through the
noise suppressor when it is on, into the session's audio buffer and, with turn detection on,
through the server VAD and its echo check (and with semantic turn detection, the end-of-turn
model: end_of_turn.py), with the idle clock running beside them.

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
from ..media.denoise import NoiseSuppressor
from ..media.echo import EchoReference
from ..media.vad import SpeechStarted, SpeechStopped
from ..pcm import INPUT_BYTES_PER_MS, MAX_AUDIO_BUFFER_BYTES
from .audio_buffer import AudioBuffer
from .end_of_turn import EndOfTurn, Spawn
from .idle_prompt import IdleClock, IdleTimeout
from .inbox import WorkItem
from .turn_taking import EchoIgnored, ServerVad, SpeechLasted, TurnTakingEvent, VadSettings, VoicePaused, VoiceResumed

BargeIn = Literal["hold", "release", "interrupt"]


@dataclass(frozen=True)
class Heard(WorkItem):
    """The server VAD heard speech start or stop, or the talker's echo end; or nobody spoke for the
    idle timeout."""

    name = "turn_taking"
    event: TurnTakingEvent | IdleTimeout


class Listening:
    """The session's microphone buffer and, when turn detection is on, its server VAD."""

    def __init__(self, queue_work: Callable[[WorkItem], None], spawn: Spawn) -> None:
        self.audio = AudioBuffer(MAX_AUDIO_BUFFER_BYTES)
        self.detection: VadSettings | None = None
        self._vad: ServerVad | None = None
        self._end_of_turn: EndOfTurn | None = None
        self._idle: IdleClock | None = None
        self._user_speaking = False
        self._denoiser: NoiseSuppressor | None = None
        self._queue_work = queue_work
        self._spawn = spawn
        self._barge: Literal["none", "judging", "false"] = "none"  # the current segment over an answer

    @property
    def position_ms(self) -> float:
        """The audio timeline's end: milliseconds of audio heard so far."""
        return self.audio.end_ms

    def detect(self, detection: VadSettings | None, echo: EchoReference | None) -> None:
        """Turn detection with these settings from now on (a fresh VAD, no open turn, a silence
        starting), or none."""
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
                self._heard,
                self._spawn,
            )
        self._barge = "none"
        self._user_speaking = False
        timeout_ms = detection.idle_timeout_ms if detection is not None else None
        self._idle = IdleClock(timeout_ms) if timeout_ms is not None else None
        self._idle_from(self.position_ms)

    def suppress_noise(self, strength: float | None) -> None:
        """RNNoise at this strength on all that is heard from now on, or no suppression (None).
        A change of strength keeps the suppressor's state (media/denoise.py)."""
        if strength is None:
            self._denoiser = None
        elif self._denoiser is None:
            self._denoiser = NoiseSuppressor(strength)
        else:
            self._denoiser.strength = strength

    def hear(self, pcm16: bytes) -> bool:
        """Buffer 16 kHz audio and listen to it; False when the buffer overflowed (and was emptied)."""
        metrics.AUDIO_MS_IN.inc(len(pcm16) / INPUT_BYTES_PER_MS)
        if self._denoiser is not None:
            pcm16 = self._denoiser.feed(pcm16)
        kept = self.audio.append(pcm16)
        if self._vad is not None:
            for event in self._vad.feed(pcm16):
                if self._end_of_turn is None or self._end_of_turn.hear(event):
                    self._heard(event)
            if self._end_of_turn is not None:
                self._end_of_turn.heard_until(self._vad.vad.position_ms)
        if self._idle is not None and (timeout := self._idle.check(self.position_ms)) is not None:
            self._queue_work(Heard(timeout))
        return kept

    def _heard(self, event: TurnTakingEvent) -> None:
        """An event for the session (an open turn's pauses are not: its end is), which the idle clock follows."""
        self._note_speech(event)
        self._queue_work(Heard(event))

    def _note_speech(self, event: TurnTakingEvent) -> None:
        if isinstance(event, SpeechStarted):
            self._user_speaking = True
            self.busy()
        elif isinstance(event, SpeechStopped):
            self._user_speaking = False
            self._idle_from(event.audio_end_ms)

    def busy(self) -> None:
        """Someone speaks, or an answer is on its way: no idle prompt until the next silence."""
        if self._idle is not None:
            self._idle.stop()

    def answered(self, playback_left_ms: float) -> None:
        """An answer ended; the client still plays `playback_left_ms` of its speech, then a silence starts."""
        self._idle_from(self.position_ms + playback_left_ms)

    def _idle_from(self, at_ms: float) -> None:
        if self._idle is not None and not self._user_speaking:
            self._idle.start(at_ms)

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

    def silence(self, timeout: IdleTimeout) -> bytes:
        """The idle timeout's silence, taken out of the buffer: what the user "said"."""
        return self.audio.take_range(timeout.audio_start_ms, timeout.audio_end_ms)
