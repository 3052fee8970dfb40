"""The listening path's judgement of voice over an answer (sessions/listening.py), branch by branch,
with VAD events as ServerVad would report them."""

from __future__ import annotations

from rtc_omni.media.vad import SpeechStarted, SpeechStopped
from rtc_omni.sessions.listening import Listening
from rtc_omni.sessions.turn_taking import EchoIgnored, SpeechLasted, VadSettings, VoicePaused, VoiceResumed
from rtc_omni.tasks import TaskSet


def listening(interrupt_response: bool = True) -> Listening:
    path = Listening(lambda work: None, TaskSet().spawn)  # server VAD alone: nothing is spawned
    path.detect(VadSettings(interrupt_response=interrupt_response), echo=None)
    path.audio.append(bytes(32 * 3000))  # 3 s of 16 kHz audio to cut utterances from
    return path


def test_voice_over_an_answer_holds_it_and_lasting_voice_interrupts() -> None:
    path = listening()
    assert path.barge_in(SpeechStarted(1000), answering=True) == "hold"
    assert path.barge_in(SpeechLasted(1000), answering=True) == "interrupt"
    assert path.utterance(SpeechStopped(1000, 2000, True)) is not None  # the speech is a turn


def test_a_burst_releases_the_answer_and_is_no_turn() -> None:
    path = listening()
    assert path.barge_in(SpeechStarted(1000), answering=True) == "hold"
    assert path.barge_in(VoicePaused(1150), answering=True) == "release"
    assert path.barge_in(VoicePaused(1150), answering=True) is None  # once
    assert path.utterance(SpeechStopped(1000, 1150, True)) is None
    assert path.barge_in(SpeechStarted(2500), answering=True) == "hold"  # the next segment is judged afresh


def test_voice_that_comes_back_is_held_again_and_may_still_interrupt() -> None:
    path = listening()
    path.barge_in(SpeechStarted(1000), answering=True)
    path.barge_in(VoicePaused(1100), answering=True)
    assert path.barge_in(VoiceResumed(1200), answering=True) == "hold"
    assert path.barge_in(SpeechLasted(1000), answering=True) == "interrupt"
    assert path.utterance(SpeechStopped(1000, 1800, True)) is not None


def test_without_an_answer_or_with_interrupts_off_voice_is_only_a_turn() -> None:
    for path, answering in ((listening(), False), (listening(interrupt_response=False), True)):
        assert path.barge_in(SpeechStarted(1000), answering=answering) is None
        assert path.barge_in(VoicePaused(1100), answering=answering) is None
        assert path.barge_in(SpeechLasted(1000), answering=answering) is None
        assert path.utterance(SpeechStopped(1000, 1250, True)) is not None  # a short "yes" is a turn


def test_echo_and_noise_stay_no_turn() -> None:
    path = listening()
    assert path.utterance(EchoIgnored(1500)) is None
    assert path.utterance(SpeechStopped(1000, 1100, False)) is None
