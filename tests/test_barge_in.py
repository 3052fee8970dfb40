"""Barge-in that needs speech, and recovers (docs/turn-taking.md), on a WebRTC realtime call: voice
over the answer holds its speech at once; a cough-like burst releases it where it stopped, the answer
completes and the burst is no turn; speech lasting --min-interruption-ms cancels it as before."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import numpy as np
import pytest

from rtc_omni.client.media import ScriptedAudioTrack, speech48

from .conftest import ServerFactory
from .test_realtime_calls import TIMEOUT_S, Call

pytestmark = pytest.mark.media  # real aiortc peers, the talker and the VAD

VAD = {"type": "server_vad", "silence_duration_ms": 500, "create_response": False}
FRAME_S = 0.02


def cough(seconds: float = 0.15) -> np.ndarray:
    """A burst of noise that rises and falls fast, as a cough does, at 48 kHz."""
    rng = np.random.default_rng(7)
    n = int(seconds * 48_000)
    envelope = np.sin(np.linspace(0, np.pi, n)) ** 0.5
    return (0.5 * envelope * rng.standard_normal(n)).clip(-1, 1).astype(np.float32)


@pytest.fixture
async def scripted() -> AsyncIterator[tuple[Call, ScriptedAudioTrack]]:
    mic = ScriptedAudioTrack()
    peer = Call(microphone=mic)
    yield peer, mic
    if peer.recorder is not None:
        await peer.recorder.stop()
    await peer.pc.close()


async def speak_and_wait_for_voice(call: Call) -> None:
    call.send(
        {
            "type": "conversation.item.create",
            "item": {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Talk."}]},
        }
    )
    call.send({"type": "response.create"})
    await call.wait("output_audio_buffer.started")
    assert call.recorder is not None
    async with asyncio.timeout(TIMEOUT_S):
        while call.recorder.voiced_frames() < 25:  # half a second heard
            await asyncio.sleep(0.02)


def longest_silence_s(call: Call, since: float, until: float) -> float:
    """The longest run of silent frames the peer decoded between two moments."""
    assert call.recorder is not None
    run = longest = 0
    for frame in call.recorder.frames:
        if since <= frame.at <= until:
            run = run + 1 if frame.rms < call.recorder.SILENCE_RMS else 0
            longest = max(longest, run)
    return longest * FRAME_S


async def test_a_cough_over_the_answer_pauses_it_and_it_resumes_where_it_stopped(
    make_server: ServerFactory, scripted: tuple[Call, ScriptedAudioTrack]
) -> None:
    call, mic = scripted
    server = await make_server(spoken_sentences=5)  # seconds of speech after the barge-in
    await call.connect(server, {"type": "realtime", "audio": {"input": {"turn_detection": VAD}}})
    await speak_and_wait_for_voice(call)
    mark = len(call.events)
    mic.say(cough())
    started = await call.wait("input_audio_buffer.speech_started", after=mark)
    done = await call.wait("response.done", after=mark)
    await call.wait("input_audio_buffer.speech_stopped", after=mark)
    await asyncio.sleep(0.5)

    types = [event["type"] for event in call.events[mark:]]
    assert done["response"]["status"] == "completed"  # not cancelled
    assert "output_audio_buffer.cleared" not in types and "input_audio_buffer.committed" not in types
    # The peer heard a gap no longer than the cough (the speech paused while it was judged), and then
    # the rest: the answer played out whole.
    assert longest_silence_s(call, started["_at"] - 0.3, done["_at"] - 0.3) <= 0.15
    sent_ms = server.registry.get(call.call_id).session.talker.voiced_ms_sent
    assert call.recorder is not None and call.recorder.voiced_frames() * 20 >= sent_ms - 300


async def test_speech_over_the_answer_still_cancels_it(
    make_server: ServerFactory, scripted: tuple[Call, ScriptedAudioTrack], espeak_ng: str
) -> None:
    call, mic = scripted
    server = await make_server(spoken_sentences=5)
    await call.connect(server, {"type": "realtime", "audio": {"input": {"turn_detection": VAD}}})
    await speak_and_wait_for_voice(call)
    mark = len(call.events)
    mic.say(speech48("Wait, stop there please."))  # well over 600 ms
    done = await call.wait("response.done", after=mark)
    committed = await call.wait("input_audio_buffer.committed", after=mark)

    assert done["response"]["status"] == "cancelled"
    assert done["response"]["status_details"]["reason"] == "turn_detected"
    assert committed["item_id"]  # the speech is a turn
