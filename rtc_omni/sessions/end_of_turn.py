"""Semantic end of turn: a pause ends the user's turn only when the end-of-turn model hears a
finished utterance, or when the eagerness cap has passed since the last speech.

It sits between the server VAD (turn_taking.py) and the session's inbox, in the listening path
(listening.py): the session sees a turn start at its first speech and stop when the turn ends,
however many pauses it had, so "What is the weather like in ... Paris today?" is one utterance.
The model runs off the event loop (engines/smart_turn.py); a session asks about one pause at a
time, and speech resuming withdraws the question. The cap counts audio, as the VAD's silence does.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, Literal

from ..engines import smart_turn
from ..media.vad import SpeechStarted, SpeechStopped
from ..protocol.realtime_events import TurnDetectionConfig
from ..protocol.understand_messages import TurnDetection
from .audio_buffer import AudioBuffer
from .turn_taking import FALLBACK_SILENCE_MS, EchoIgnored, Semantic, TurnTakingEvent

logger = logging.getLogger(__name__)

JUDGE_TIMEOUT_S = 1.0  # a busy process ends the turn on silence rather than keep the user waiting
WINDOW_MS = smart_turn.WINDOW_S * 1000

Predictor = Callable[[bytes], Awaitable[float]]  # 16 kHz PCM16 ending at a pause -> P(finished)
Spawn = Callable[[Coroutine[Any, Any, Any]], "asyncio.Task[Any]"]


def fallback_silence_ms(
    detection: TurnDetectionConfig | TurnDetection | None, model: Literal["auto", "none"]
) -> int | None:
    """When semantic turn detection is asked for but cannot run here (`--end-of-turn-model none`, or
    the model is not installed), the silence it falls back to; None when nothing falls back."""
    if detection is None or detection.type != "semantic_vad" or (model == "auto" and smart_turn.unavailable() is None):
        return None
    return FALLBACK_SILENCE_MS[Semantic(detection.eagerness).level]


async def smart_turn_predictor(pcm16: bytes) -> float:
    """The model on its one process-wide thread; cancelling the caller withdraws a waiting request."""
    return await asyncio.get_running_loop().run_in_executor(smart_turn.executor, smart_turn.complete_probability, pcm16)


class EndOfTurn:
    """One session's open turn: held across pauses until the model or the cap ends it."""

    def __init__(
        self,
        semantic: Semantic,
        audio: AudioBuffer,
        prefix_padding_ms: int,
        ended: Callable[[SpeechStopped], None],
        spawn: Spawn,
        predict: Predictor = smart_turn_predictor,
    ) -> None:
        self.semantic = semantic
        self._audio = audio
        self._prefix_padding_ms = prefix_padding_ms
        self._ended = ended
        self._spawn = spawn
        self._predict = predict
        self._start_ms: float | None = None  # the open turn's first speech; None: no turn open
        self._end_ms: float | None = None  # the end of its last speech; None while it had only noise
        self._paused = False
        self._judging: asyncio.Task[Any] | None = None

    @property
    def open(self) -> bool:
        return self._start_ms is not None

    def hear(self, event: TurnTakingEvent) -> bool:
        """Whether the session hears of this VAD event: a turn's first speech, the voice within a
        segment, and noise or echo outside a turn; pauses and resumptions belong to the open turn,
        which `ended` reports when it ends."""
        if isinstance(event, SpeechStarted):
            return self._speech_started(event)
        if not isinstance(event, SpeechStopped) or not self.open:
            return not (self.open and isinstance(event, EchoIgnored))  # the voice within a segment: barge-in's
        if self._end_ms is None and not event.is_speech:  # noise opened the turn: it was none
            self._start_ms = None
            return True
        if event.is_speech:
            self._end_ms = event.audio_end_ms
        self._paused = True
        self._withdraw()
        assert self._start_ms is not None
        first = max(self._start_ms - self._prefix_padding_ms, self._audio.end_ms - WINDOW_MS)
        self._judging = self._spawn(self._judge(self._audio.read_range(first, self._audio.end_ms)))
        return False

    def _speech_started(self, event: SpeechStarted) -> bool:
        if self.open and self._past_cap(event.audio_start_ms):
            self._end_turn()
        if self.open:  # the user goes on: the question about the pause is withdrawn
            self._withdraw()
            self._paused = False
            return False
        self._start_ms, self._end_ms, self._paused = event.audio_start_ms, None, False
        return True

    def heard_until(self, position_ms: float) -> None:
        """The VAD has heard audio up to here: a pause longer than the cap ends the turn."""
        if self._paused and self._past_cap(position_ms):
            self._end_turn()

    def close(self) -> None:
        """Forget the open turn (settings changed, or the session ends)."""
        self._withdraw()
        self._start_ms = self._end_ms = None
        self._paused = False

    def _past_cap(self, position_ms: float) -> bool:
        return self._end_ms is not None and position_ms >= self._end_ms + self.semantic.cap_ms

    async def _judge(self, pcm16: bytes) -> None:
        try:
            async with asyncio.timeout(JUDGE_TIMEOUT_S):
                probability = await self._predict(pcm16)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # a failing or overloaded model: the pause's silence decides
            logger.warning("the end-of-turn model failed, the pause ends the turn: %r", exc)
            probability = 1.0
        self._judging = None
        logger.debug("end of turn: p(finished) = %.3f (threshold %.2f)", probability, self.semantic.threshold)
        if probability >= self.semantic.threshold:
            self._end_turn()

    def _withdraw(self) -> None:
        if self._judging is not None:
            self._judging.cancel()
            self._judging = None

    def _end_turn(self) -> None:
        assert self._start_ms is not None and self._end_ms is not None
        ended = SpeechStopped(self._start_ms, self._end_ms, True)
        self.close()
        self._ended(ended)
