"""One spoken answer, whatever the protocol: the engine's stream for one turn, its text and speech
to the session and the talker, the wait for play-out, the interrupt, and how a failure is told.

A conversational session keeps only its protocol: it maps the `AnswerEvents` callbacks to its own
events. The latency histograms and the outcome counters in /metrics are counted here, once, for
every session kind; a failure is classified and logged here, once.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass
from typing import Any, Literal, Protocol

from .. import metrics
from ..engines.engine import (
    AudioChunk,
    ContextLost,
    EngineError,
    FunctionArguments,
    FunctionCallStarted,
    TextDelta,
    UnderstandEngine,
    UnderstandTurn,
    Usage,
)
from ..pcm import TALKER_SAMPLE_RATE, float_to_pcm16, pcm16_ms
from ..protocol.validation import error_text
from .engine_stream import stall_bounded
from .outputs import Talker
from .session import CANCEL_WAIT_S

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Failure:
    """Why an answer failed: the engine went silent, the engine reported an error fit for the
    client (`detail`), or a bug (logged with its traceback)."""

    kind: Literal["stalled", "engine", "bug"]
    detail: str | None = None


class AnswerEvents(Protocol):
    """What a session tells its client as an answer goes; every callback runs on the answer's task."""

    def on_first_output(self, answer: Answer) -> None: ...

    def on_text(self, answer: Answer, delta: str) -> None: ...

    def on_audio(self, answer: Answer, pcm16: bytes, first: bool) -> None:
        """24 kHz PCM16, before the talker has it."""

    def on_function_call(self, answer: Answer, output: FunctionCallStarted | FunctionArguments) -> None:
        """A call starts, or its arguments go on; only turns that offered tools bring these."""

    def on_context_lost(self, answer: Answer, reason: str) -> None: ...

    def on_generated(self, answer: Answer) -> None:
        """The engine's stream ended; its speech may still be playing."""

    def on_completed(self, answer: Answer) -> None:
        """Generated and played out."""

    def on_failed(self, answer: Answer, failure: Failure) -> None: ...


Outcome = Literal["started", "completed", "cancelled", "failed"]
Abort = Callable[[str], Awaitable[None]]
Spawn = Callable[[Coroutine[Any, Any, Any]], "asyncio.Task[Any]"]


# A held answer goes on by itself after this long: the listening path that held it (a barge-in still
# to be proved speech) always releases or interrupts it sooner, unless the microphone stopped mid-word.
HOLD_LIMIT_S = 3.0


class Answer:
    """One answer in flight. `start` it with what builds its engine turn; `interrupt` it at most once;
    `hold` its speech while a barge-in is judged, and `release` it when it was no speech."""

    def __init__(
        self,
        request_id: str,
        *,
        session_id: str,
        engine: UnderstandEngine,
        talker: Talker | None,
        events: AnswerEvents,
        abort: Abort,
        stall_timeout: float,
        tally: Counter[Outcome],
    ) -> None:
        self.request_id = request_id
        self.session_id = session_id
        self.talker = talker
        self.text = ""
        self.audio_seen = False
        self.audio_ms = 0.0  # of speech the engine gave
        self.speaking = False  # its speech reached the talker
        self.engine_finished = False
        self.usage: Usage | None = None  # the engine's count, when it gives one
        self._engine = engine
        self._events = events
        self._abort = abort
        self._stall_timeout = stall_timeout
        self._task: asyncio.Task[None] | None = None
        self._tally = tally  # the session's own count of its answers' outcomes
        self._hold_limit: asyncio.TimerHandle | None = None

    @property
    def playback_left_ms(self) -> float:
        """How much of its speech the client may still be playing once it has ended: none when the
        talker played it out, all of it when it went out as events (the client plays it after)."""
        return 0.0 if self.speaking else self.audio_ms

    @property
    def running(self) -> bool:
        return self._task is not None and not self._task.done()

    def start(self, spawn: Spawn, build: Callable[[], Awaitable[UnderstandTurn]]) -> None:
        self._count("started")
        self._task = spawn(self._run(build))

    async def wait(self, timeout: float) -> bool:
        """Wait for the answer to end by itself; False when `timeout` passed first."""
        if self._task is None:
            return True
        done, _ = await asyncio.wait([self._task], timeout=timeout)
        return bool(done)

    @property
    def held(self) -> bool:
        return self._hold_limit is not None

    def hold(self) -> None:
        """Stop its speech at once but keep the rest (the engine goes on): the user may be speaking."""
        if self.talker is None or not self.running or self.held:
            return
        self.talker.hold()
        self._hold_limit = asyncio.get_running_loop().call_later(HOLD_LIMIT_S, self.release)

    def release(self) -> None:
        """Go on speaking from where `hold` stopped: it was no speech."""
        if self._hold_limit is None:
            return
        self._hold_limit.cancel()
        self._hold_limit = None
        if self.talker is not None:
            self.talker.release()

    def judged(self, *, hold: bool) -> None:
        """What the listening path made of voice over the answer, short of interrupting it: hold
        the speech while the voice is judged, or release it (it was no speech)."""
        if hold:
            self.hold()
        else:
            self.release()

    async def interrupt(self) -> float | None:
        """Stop its text, flush its speech, abort its engine request: the milliseconds of speech the
        talker had not played (what truncation cuts), or None when the answer had already ended."""
        if self._hold_limit is not None:
            self._hold_limit.cancel()
            self._hold_limit = None
        if self._task is None or self._task.done():
            return None
        self._task.cancel()
        await asyncio.wait([self._task], timeout=CANCEL_WAIT_S)
        unplayed_ms = self.talker.flush() if self.talker is not None else 0.0
        if not self.engine_finished:
            await self._abort(self.request_id)
        self._count("cancelled")
        return unplayed_ms

    async def _run(self, build: Callable[[], Awaitable[UnderstandTurn]]) -> None:
        try:
            turn = await build()
            await self._stream(turn)
            self.engine_finished = True
            self._events.on_generated(self)
            if self.speaking and self.talker is not None:
                # The answer lasts until its speech has played out, so an interrupt can still cut it.
                await self.talker.wait_drained(timeout=self._stall_timeout)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # the answer fails; the session goes on
            failure = self._classify(exc)
            if not self.engine_finished:
                await self._abort(self.request_id)
            self._count("failed")
            self._events.on_failed(self, failure)
            return
        self._count("completed")
        self._events.on_completed(self)

    async def _stream(self, turn: UnderstandTurn) -> None:
        started = time.monotonic()
        first = True
        async for output in stall_bounded(self._engine, turn, self._stall_timeout):
            if first:
                first = False
                self._events.on_first_output(self)
            if isinstance(output, TextDelta):
                if not self.text:
                    metrics.TIME_TO_FIRST_TEXT.observe(time.monotonic() - started)
                self.text += output.text
                self._events.on_text(self, output.text)
            elif isinstance(output, AudioChunk):
                if not self.audio_seen:
                    metrics.TIME_TO_FIRST_AUDIO.observe(time.monotonic() - started)
                pcm16 = float_to_pcm16(output.samples.reshape(-1))
                self.audio_ms += pcm16_ms(pcm16, TALKER_SAMPLE_RATE)
                self._events.on_audio(self, pcm16, first=not self.audio_seen)
                self.audio_seen = True
                if self.talker is not None and pcm16:
                    self.speaking = True
                    await self.talker.write(pcm16)
            elif isinstance(output, FunctionCallStarted | FunctionArguments):
                self._events.on_function_call(self, output)
            elif isinstance(output, ContextLost):
                self._events.on_context_lost(self, output.reason)
            elif isinstance(output, Usage):
                self.usage = output

    def _count(self, outcome: Outcome) -> None:
        metrics.TURNS.labels(outcome).inc()
        self._tally[outcome] += 1

    def _classify(self, exc: Exception) -> Failure:
        """One way to tell and log a failure: a stall or an engine's error is the engine's, anything
        else a bug, logged with its traceback."""
        if isinstance(exc, TimeoutError):
            logger.warning("session %s: answer %s stalled", self.session_id, self.request_id)
            return Failure("stalled")
        if isinstance(exc, EngineError):
            logger.warning("session %s: answer %s failed: %s", self.session_id, self.request_id, exc)
            return Failure("engine", error_text(exc))
        logger.exception("session %s: answer %s failed", self.session_id, self.request_id)
        return Failure("bug")
