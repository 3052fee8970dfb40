"""Server VAD over real aiortc peers speaking espeak-ng sentences into their microphone."""

from __future__ import annotations

import asyncio
import re
import time

import numpy as np
import pytest

from rtc_omni.client.media import COLOURS, ColourVideoTrack, ScriptedAudioTrack, speech48
from rtc_omni.client.rtc_peers import UnderstandClient
from rtc_omni.media.vad import VoiceActivityDetector

from .conftest import RunningServer, ServerFactory

pytestmark = pytest.mark.usefixtures("espeak_ng")

VAD = {"turn_detection": {"type": "server_vad"}}


def seconds(samples: np.ndarray) -> float:
    return samples.size / 48_000


def silence(s: float) -> np.ndarray:
    return np.zeros(int(s * 48_000), dtype=np.float32)


def reported_speech_seconds(text: str) -> float:
    return float(re.search(r"speech segment lasted ([\d.]+) seconds", text).group(1))


async def speaking_client(server: RunningServer, config: dict, echo_gain: float = 0.0, **kwargs) -> UnderstandClient:
    mic = ScriptedAudioTrack(echo_gain=echo_gain)
    client = UnderstandClient(server.url, video=ColourVideoTrack(COLOURS["red"], 160, 120, 15), audio=mic, **kwargs)
    await client.connect()
    if client.channel is not None:
        await client.configure(**config)
        await client.wait_event("video.frame.ack")
    return client


@pytest.mark.media
async def test_each_pause_ends_a_turn_with_that_speech(server: RunningServer) -> None:
    first, second = speech48("What colour is this?"), speech48("And what can you hear now?")
    client = await speaking_client(server, {**VAD, "modalities": ["text"]})
    try:
        mic = client.audio
        noise = np.random.default_rng(7).normal(0, 0.03, int(2.5 * 48_000)).astype(np.float32)
        for clip in (noise, silence(1.0), first, silence(1.0), second, silence(1.2)):
            mic.say(clip)
        done = [await client.wait_event("response.text.done", timeout=20)]
        done.append(await client.wait_event("response.text.done", after=client.events.index(done[0]) + 1, timeout=20))
        await asyncio.sleep(1.5)
    finally:
        await client.close()

    starts = [e for e in client.events if e["type"] == "response.start"]
    assert len(starts) == 2  # none for the noise or the silences
    for event, clip in zip(done, (first, second)):
        assert abs(reported_speech_seconds(event["text"]) - seconds(clip)) <= 0.15, (event["text"], seconds(clip))
        assert "You asked nothing in text" in event["text"] and "mostly red" in event["text"]
    kinds = [e["type"] for e in client.events]
    assert kinds.count("input_audio.speech_started") >= 2 and kinds.count("input_audio.speech_stopped") >= 2
    first_stop = next(e for e in client.events if e["type"] == "input_audio.speech_stopped")
    assert kinds.index("input_audio.speech_stopped") < kinds.index("response.start")
    assert first_stop["audio_end_ms"] > 3000  # after the noise and the first silence


@pytest.mark.media
async def test_talking_over_the_answer_interrupts_it(make_server: ServerFactory) -> None:
    server = await make_server(synthetic_audio_speed=2.0)
    first, second = speech48("Tell me everything."), speech48("Stop, that is enough.")
    client = await speaking_client(server, VAD)
    try:
        client.audio.say(first)
        start = await client.wait_event("response.start", timeout=20)
        async with asyncio.timeout(10):  # the talker is speaking
            while client.recorder.voiced_frames(since=client.event_times[client.events.index(start)]) < 10:
                await asyncio.sleep(0.02)
        mark = len(client.events)
        client.audio.say(second)
        cancelled = await client.wait_event("response.cancelled", after=mark, timeout=10)
        next_start = await client.wait_event("response.start", after=mark, timeout=20)
        answer = await client.wait_event("response.text.done", after=client.events.index(next_start), timeout=20)
    finally:
        await client.close()
    assert cancelled["request_id"] == start["request_id"]
    assert next_start["request_id"] != start["request_id"]
    kinds = [e["type"] for e in client.events[mark:]]
    assert kinds.index("input_audio.speech_started") < kinds.index("response.cancelled")
    assert abs(reported_speech_seconds(answer["text"]) - seconds(second)) <= 0.15


@pytest.mark.media
async def test_a_cough_over_the_answer_does_not_interrupt_it(make_server: ServerFactory) -> None:
    """The legacy protocol shares the listening path: a burst shorter than min_interruption_ms holds
    the answer and releases it; the answer completes and the burst starts no turn."""
    server = await make_server(synthetic_audio_speed=2.0, spoken_sentences=3)
    client = await speaking_client(server, {"turn_detection": {"type": "server_vad", "min_interruption_ms": 400}})
    try:
        client.audio.say(speech48("Tell me everything."))
        start = await client.wait_event("response.start", timeout=20)
        async with asyncio.timeout(10):  # the talker is speaking
            while client.recorder.voiced_frames(since=client.event_times[client.events.index(start)]) < 10:
                await asyncio.sleep(0.02)
        mark = len(client.events)
        rng = np.random.default_rng(7)
        burst = 0.5 * np.sin(np.linspace(0, np.pi, 7200)) ** 0.5 * rng.standard_normal(7200)
        client.audio.say(burst.clip(-1, 1).astype(np.float32))  # 150 ms
        await client.wait_event("input_audio.speech_started", after=mark, timeout=10)
        done = await client.wait_event("response.audio.done", after=mark, timeout=30)  # played out
        await asyncio.sleep(1.0)  # the burst's segment ends
    finally:
        await client.close()
    kinds = [e["type"] for e in client.events[mark:]]
    assert done["request_id"] == start["request_id"]
    assert "response.cancelled" not in kinds and "response.start" not in kinds


@pytest.mark.media
async def test_the_talkers_own_echo_does_not_interrupt(make_server: ServerFactory) -> None:
    server = await make_server(synthetic_audio_speed=2.0, spoken_sentences=2)  # ~4 s of talker, all echoed
    client = await speaking_client(server, VAD, echo_gain=0.8)
    try:
        client.recorder.echo_to = client.audio.echo  # loudspeaker -> microphone, no echo cancellation
        client.audio.say(speech48("Please describe the scene."))
        start = await client.wait_event("response.start", timeout=20)
        done = await client.wait_event("response.audio.done", timeout=60)
        await asyncio.sleep(1.5)
    finally:
        await client.close()
    kinds = [(e["type"], e.get("request_id", "")[-4:]) for e in client.events if e["type"] != "video.frame.ack"]
    assert done["request_id"] == start["request_id"], kinds
    assert not [e for e in client.events if e["type"] == "response.cancelled"]
    assert len([e for e in client.events if e["type"] == "response.start"]) == 1
    heard = client.recorder.voiced_frames(since=client.event_times[client.events.index(start)])
    assert heard > 100  # the whole answer was spoken, echo and all (> 2 s)


@pytest.mark.media
async def test_a_peer_without_a_datachannel_gets_answers_by_speaking(make_server: ServerFactory) -> None:
    server = await make_server(turn_detection="server_vad", config_timeout=0.3)
    client = await speaking_client(server, {}, control=False)
    try:
        await asyncio.sleep(1.0)  # the session applies its defaults, server VAD included
        said_at = time.monotonic()
        client.audio.say(speech48("Hello, can you hear me?"))
        async with asyncio.timeout(20):
            while client.recorder.voiced_frames(since=said_at) < 25:
                await asyncio.sleep(0.05)
        stats = server.registry.get(client.session_id).session.stats()
    finally:
        await client.close()
    assert stats["turn_detection"] == "server_vad" and stats["turns_started"] == 1


def test_vad_segments_match_speech_and_ignore_noise_and_tones() -> None:
    rng = np.random.default_rng(3)
    speech16 = speech48("What colour is this?")[::3]
    track = np.concatenate([np.zeros(16_000), speech16, np.zeros(16_000)])
    pcm = (np.clip(track + rng.normal(0, 0.005, track.size), -1, 1) * 32767).astype("<i2").tobytes()
    events = VoiceActivityDetector().feed(pcm)
    assert len(events) == 2
    assert abs(events[1].duration_ms / 1000 - speech16.size / 16_000) < 0.15 and events[1].is_speech
    for steady in (rng.normal(0, 0.05, 80_000), 0.3 * np.sin(2 * np.pi * 440 * np.arange(80_000) / 16_000)):
        assert VoiceActivityDetector().feed((steady * 32767).astype("<i2").tobytes()) == []
