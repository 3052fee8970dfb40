"""Engine trouble and audio-as-events: what a peer sees when the model misbehaves or has no audio track."""

from __future__ import annotations

import asyncio
import base64
import io
import wave
from collections.abc import AsyncIterator

import numpy as np

from rtc_omni.engines import SyntheticEngine, TextDelta, UnderstandOutput, UnderstandTurn

from .conftest import ClientFactory, RunningServer, ServerFactory


class FlakyEngine(SyntheticEngine):
    """Fails (or hangs) on queries that ask for it, answers the rest like the synthetic engine."""

    async def generate(self, turn: UnderstandTurn) -> AsyncIterator[UnderstandOutput]:
        if turn.query in ("crash", "hang"):
            yield TextDelta("partial answer")
            if turn.query == "crash":
                raise RuntimeError("model exploded")
            await asyncio.sleep(3600)
        async for output in super().generate(turn):
            yield output


async def test_engine_failure_is_reported_and_the_next_turn_works(
    make_server: ServerFactory, make_client: ClientFactory
) -> None:
    server = await make_server(engine=FlakyEngine(ttft=0.01, token_rate=200, voice="tone"))
    client = await make_client(server, colour="red", tone=None, config={"modalities": ["text"]})
    await client.wait_event("video.frame.ack")

    failed = await client.ask("crash")
    assert failed.errors == ["Query processing failed"]
    assert [e["type"] for e in failed.events][-2:] == ["error", "response.text.done"]
    assert failed.events[-1]["text"] == "partial answer"

    result = await client.ask("are you back?")
    assert not result.errors and "mostly red" in result.text


async def test_stalled_engine_times_out_and_is_aborted(make_server: ServerFactory, make_client: ClientFactory) -> None:
    engine = FlakyEngine(ttft=0.01, token_rate=200, voice="tone")
    server = await make_server(engine=engine, engine_stall_timeout=0.5)
    client = await make_client(server, colour="red", tone=None, config={"modalities": ["text"]})
    await client.wait_event("video.frame.ack")

    stalled = await client.ask("hang")
    assert stalled.errors == ["Engine stall timeout: no output"]
    assert stalled.request_id in engine.recent_aborts
    assert not (await client.ask("hello")).errors


async def test_audio_events_carry_wav_for_peers_without_an_audio_track(
    server: RunningServer, make_client: ClientFactory
) -> None:
    client = await make_client(server, colour="blue", tone=None, receive_audio=False, config={"audio_events": True})
    assert client.recorder is None
    await client.wait_event("video.frame.ack")

    result = await client.ask("speak")

    deltas = [e for e in result.events if e["type"] == "response.audio.delta"]
    assert len(deltas) >= 2 and all(e["format"] == "wav" for e in deltas)
    samples = 0
    for event in deltas:
        with wave.open(io.BytesIO(base64.b64decode(event["data"]))) as wav:
            assert (wav.getframerate(), wav.getnchannels(), wav.getsampwidth()) == (24000, 1, 2)
            pcm = np.frombuffer(wav.readframes(wav.getnframes()), dtype="<i2")
            samples += pcm.size
    assert samples / 24000 > 2.0 and np.abs(pcm).max() > 1000
    assert result.events[-1]["type"] == "response.audio.done"
