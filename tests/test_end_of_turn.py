"""Semantic end of turn's decisions, each branch with a stub predictor in place of the model
(the model itself: tests/test_smart_turn.py; whole sessions: tests/test_semantic_turns.py)."""

from __future__ import annotations

import asyncio
import threading

import pytest

from rtc_omni.engines import smart_turn
from rtc_omni.media.vad import SpeechStarted, SpeechStopped
from rtc_omni.pcm import INPUT_BYTES_PER_MS
from rtc_omni.sessions.audio_buffer import AudioBuffer
from rtc_omni.sessions.end_of_turn import EndOfTurn, Predictor
from rtc_omni.sessions.turn_taking import CAP_MS, EchoIgnored, Semantic, SpeechLasted, VoicePaused, VoiceResumed
from rtc_omni.tasks import TaskSet

HIGH = Semantic("high")  # threshold 0.4, cap 2 s


class Stub:
    """A predictor that answers each question with the next of `answers` (in the order asked), once
    `release` is set."""

    def __init__(self, *answers: float | Exception, held: bool = False) -> None:
        self.answers = list(answers)
        self.heard: list[bytes] = []
        self.release = asyncio.Event()
        if not held:
            self.release.set()

    async def __call__(self, pcm16: bytes) -> float:
        self.heard.append(pcm16)
        answer = self.answers.pop(0)
        await self.release.wait()
        if isinstance(answer, Exception):
            raise answer
        return answer


class Turns:
    """An EndOfTurn over a real audio buffer, and what it reported."""

    def __init__(self, predict: Predictor, semantic: Semantic = HIGH) -> None:
        self.audio = AudioBuffer(10**8)
        self.ended: list[SpeechStopped] = []
        self.tasks = TaskSet()
        self.end_of_turn = EndOfTurn(semantic, self.audio, 300, self.ended.append, self.tasks.spawn, predict)

    def feed_until(self, ms: float) -> None:
        """Audio up to `ms` on the timeline, as the listening path buffers it before the VAD hears it."""
        self.audio.append(bytes(int((ms - self.audio.end_ms) * INPUT_BYTES_PER_MS)))

    def speak(self, start_ms: float, end_ms: float) -> None:
        """A turn's first speech, then a pause after it."""
        assert self.end_of_turn.hear(SpeechStarted(start_ms))
        assert not self.end_of_turn.hear(SpeechStopped(start_ms, end_ms, True))

    async def settle(self) -> None:
        await asyncio.sleep(0.01)


async def test_a_pause_judged_finished_ends_the_turn_there() -> None:
    turns = Turns(Stub(0.9))
    turns.feed_until(1200)
    assert turns.end_of_turn.hear(SpeechStarted(1000))  # the session announces the turn
    turns.feed_until(2700)
    assert not turns.end_of_turn.hear(SpeechStopped(1000, 2400, True))
    await turns.settle()
    assert turns.ended == [SpeechStopped(1000, 2400, True)]
    assert not turns.end_of_turn.open


@pytest.mark.parametrize(
    ("pause_at", "heard_ms"),
    [(2700, 2700 - 700), (20_000, smart_turn.WINDOW_S * 1000)],
    ids=["from its prefix padding", "the last eight seconds at most"],
)
async def test_the_model_hears_the_turn_up_to_the_pause(pause_at: int, heard_ms: int) -> None:
    stub = Stub(0.9)
    turns = Turns(stub)
    turns.feed_until(1200)
    turns.end_of_turn.hear(SpeechStarted(1000))  # its prefix padding is 300 ms
    turns.feed_until(pause_at)
    turns.end_of_turn.hear(SpeechStopped(1000, pause_at - 300, True))
    await turns.settle()
    assert len(stub.heard[0]) == heard_ms * INPUT_BYTES_PER_MS


async def test_a_pause_judged_unfinished_holds_the_turn_until_the_cap() -> None:
    turns = Turns(Stub(0.1))
    turns.speak(1000, 2400)
    await turns.settle()
    turns.end_of_turn.heard_until(2400 + CAP_MS["high"] - 20)
    assert turns.ended == [] and turns.end_of_turn.open
    turns.end_of_turn.heard_until(2400 + CAP_MS["high"])
    assert turns.ended == [SpeechStopped(1000, 2400, True)]


async def test_the_cap_ends_a_turn_whose_question_is_still_waiting() -> None:
    stub = Stub(0.9, held=True)
    turns = Turns(stub)
    turns.speak(1000, 2400)
    turns.end_of_turn.heard_until(2400 + CAP_MS["high"])
    stub.release.set()
    await turns.settle()
    assert turns.ended == [SpeechStopped(1000, 2400, True)]  # once, by the cap


async def test_speech_resuming_keeps_one_turn_and_the_next_pause_is_judged_again() -> None:
    turns = Turns(Stub(0.1, 0.9))
    turns.speak(1000, 2400)
    await turns.settle()
    assert not turns.end_of_turn.hear(SpeechStarted(3900))  # 1.5 s later: the same turn
    turns.end_of_turn.hear(SpeechStopped(3900, 4800, True))
    await turns.settle()
    assert turns.ended == [SpeechStopped(1000, 4800, True)]  # both parts


async def test_speech_resuming_withdraws_the_question_about_the_pause() -> None:
    stub = Stub(0.9, 0.1, held=True)
    turns = Turns(stub)
    turns.speak(1000, 2400)
    await turns.settle()
    turns.end_of_turn.hear(SpeechStarted(2900))  # before the model answered "finished"
    stub.release.set()
    await turns.settle()
    assert turns.ended == [] and turns.end_of_turn.open
    turns.end_of_turn.hear(SpeechStopped(2900, 3600, True))
    await turns.settle()
    assert turns.ended == [] and stub.answers == []  # the second question got the second answer


async def test_speech_after_the_cap_ends_the_old_turn_and_starts_a_new_one() -> None:
    turns = Turns(Stub(0.1))
    turns.speak(1000, 2400)
    await turns.settle()
    assert turns.end_of_turn.hear(SpeechStarted(2400 + CAP_MS["high"] + 100))
    assert turns.ended == [SpeechStopped(1000, 2400, True)] and turns.end_of_turn.open


async def test_noise_alone_opens_no_turn_and_the_session_drops_it() -> None:
    stub = Stub()
    turns = Turns(stub)
    assert turns.end_of_turn.hear(SpeechStarted(1000))
    assert turns.end_of_turn.hear(SpeechStopped(1000, 1300, False))
    assert not turns.end_of_turn.open and stub.heard == []
    assert turns.end_of_turn.hear(EchoIgnored(2000))  # echo outside a turn: dropped as before


async def test_noise_or_echo_during_a_held_turn_is_part_of_it() -> None:
    turns = Turns(Stub(0.1, 0.1))
    turns.speak(1000, 2400)
    await turns.settle()
    assert not turns.end_of_turn.hear(SpeechStarted(2800))
    assert not turns.end_of_turn.hear(SpeechStopped(2800, 3000, False))  # judged again, the speech end kept
    assert not turns.end_of_turn.hear(EchoIgnored(3500))
    await turns.settle()
    turns.end_of_turn.heard_until(2400 + CAP_MS["high"])
    assert turns.ended == [SpeechStopped(1000, 2400, True)]


async def test_the_voice_within_a_segment_reaches_the_session_for_barge_in() -> None:
    turns = Turns(Stub(0.1))
    turns.speak(1000, 2400)
    await turns.settle()
    assert not turns.end_of_turn.hear(SpeechStarted(2800))  # the turn goes on
    for event in (SpeechLasted(2800), VoicePaused(3100), VoiceResumed(3200)):
        assert turns.end_of_turn.hear(event)


async def test_a_failing_or_slow_model_leaves_the_pause_to_end_the_turn() -> None:
    turns = Turns(Stub(RuntimeError("onnx failed")))
    turns.speak(1000, 2400)
    await turns.settle()
    assert turns.ended == [SpeechStopped(1000, 2400, True)]


async def test_each_eagerness_sets_threshold_and_cap() -> None:
    for eagerness, answer, ends in (("low", 0.6, False), ("medium", 0.6, True), ("auto", 0.45, False)):
        turns = Turns(Stub(answer), Semantic(eagerness))
        turns.speak(0, 1000)
        await turns.settle()
        assert bool(turns.ended) == ends, eagerness
    assert [Semantic(e).cap_ms for e in ("low", "medium", "auto", "high")] == [8000, 4000, 4000, 2000]


async def test_closing_withdraws_the_question() -> None:
    stub = Stub(0.9, held=True)
    turns = Turns(stub)
    turns.speak(1000, 2400)
    turns.end_of_turn.close()
    stub.release.set()
    await turns.settle()
    assert turns.ended == [] and not turns.end_of_turn.open


async def test_a_question_still_waiting_for_the_one_model_thread_is_replaced_by_the_newer_one() -> None:
    ran: list[bytes] = []

    async def on_the_model_thread(pcm16: bytes) -> float:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(smart_turn.executor, lambda: ran.append(pcm16) or 0.1)

    busy = threading.Event()
    smart_turn.executor.submit(busy.wait, 5)  # another session's inference holds the thread
    turns = Turns(on_the_model_thread)
    turns.end_of_turn.hear(SpeechStarted(1000))
    turns.feed_until(2700)
    turns.end_of_turn.hear(SpeechStopped(1000, 2400, True))
    await turns.settle()
    turns.end_of_turn.hear(SpeechStarted(2800))
    turns.feed_until(3500)
    turns.end_of_turn.hear(SpeechStopped(2800, 3200, True))
    await turns.settle()  # the withdrawal reaches the thread's queue
    busy.set()
    await asyncio.wait_for(asyncio.get_running_loop().run_in_executor(smart_turn.executor, lambda: None), 5)
    await turns.settle()
    assert [len(pcm) for pcm in ran] == [(3500 - 700) * INPUT_BYTES_PER_MS]  # only the newer question ran
