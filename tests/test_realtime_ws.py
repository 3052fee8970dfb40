"""`WS /v1/realtime` with the official `openai` SDK, unchanged except its base URL.

Every server event the tests receive is validated against the SDK's own typed server-event union
(`openai.types.realtime.RealtimeServerEvent`), so a field we drop or misname fails here.
"""

from __future__ import annotations

import base64
import io
import json
import logging
import re
from collections.abc import AsyncIterator
from typing import Any

import numpy as np
import openai
import pytest
from openai import AsyncOpenAI
from PIL import Image

from rtc_omni.engines import SyntheticEngine, TextDelta, UnderstandOutput, UnderstandTurn

from .conftest import RunningServer, ServerFactory
from .realtime_client import (
    SERVER_EVENT,
    Realtime,
    add_user_text,
    append_audio,
    connect,
    speech24k,
    text_of,
    tone_pcm24k,
)
from .waiting import wait_until

RED = (230, 20, 20)


def png_data_url(colour: tuple[int, int, int], size: tuple[int, int] = (64, 48)) -> str:
    out = io.BytesIO()
    Image.new("RGB", size, colour).save(out, format="PNG")
    return "data:image/png;base64," + base64.b64encode(out.getvalue()).decode("ascii")


def dominant_hz(pcm16: bytes, rate: int) -> float:
    samples = np.frombuffer(pcm16, dtype="<i2").astype(np.float32)
    spectrum = np.abs(np.fft.rfft(samples * np.hanning(samples.size)))
    spectrum[0] = 0
    return float(np.argmax(spectrum) * rate / samples.size)


@pytest.fixture
async def realtime(server: RunningServer) -> AsyncIterator[Realtime]:
    async with connect(server) as session:
        yield session


async def test_session_update_reports_instructions_and_unhonoured_fields_unchanged(realtime: Realtime) -> None:
    created = realtime.events[0]["session"]
    assert created["type"] == "realtime" and created["model"] == "qwen3-omni"
    assert created["audio"]["input"]["turn_detection"] is None
    await realtime.send(
        {
            "type": "session.update",
            "session": {
                "type": "realtime",
                "instructions": "Be brief.",
                "output_modalities": ["text"],
                "audio": {"output": {"voice": "marin"}},
            },
        }
    )
    updated = (await realtime.until("session.updated"))[-1]["session"]
    assert updated["instructions"] == "Be brief." and updated["output_modalities"] == ["text"]
    assert updated["audio"]["output"]["voice"] == "marin"  # accepted and reported, never changed


async def test_text_and_image_conversation_names_the_images_colour_in_openai_order(realtime: Realtime) -> None:
    await realtime.send(
        {
            "type": "conversation.item.create",
            "item": {
                "type": "message",
                "role": "user",
                "content": [
                    {"type": "input_image", "image_url": png_data_url(RED)},
                    {"type": "input_text", "text": "What colour is this?"},
                ],
            },
        }
    )
    added = await realtime.until("conversation.item.done")
    events = await realtime.respond(output_modalities=["text"])

    assert [e["type"] for e in added] == ["conversation.item.added", "conversation.item.done"]
    user_item = added[-1]["item"]
    assert [p["type"] for p in user_item["content"]] == ["input_image", "input_text"]
    types = [e["type"] for e in events]
    assert types[:4] == [
        "response.created",
        "response.output_item.added",
        "conversation.item.added",
        "response.content_part.added",
    ]
    assert types[-5:] == [
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "conversation.item.done",
        "response.done",
    ]
    assert set(types[4:-5]) == {"response.output_text.delta"}
    text = text_of(events, "response.output_text.delta")
    assert "mostly red" in text and 'You asked: "What colour is this?"' in text
    assert events[-5]["text"] == text
    done = events[-1]["response"]
    assert done["status"] == "completed" and done["output"][0]["content"][0]["text"] == text
    assert events[2]["previous_item_id"] == user_item["id"]


async def test_an_audio_turn_hears_the_tone_and_answers_with_pcm16_speech(realtime: Realtime) -> None:
    await append_audio(realtime, tone_pcm24k(440, 1.0))
    await realtime.send({"type": "input_audio_buffer.commit"})
    committed = await realtime.until("conversation.item.done")
    events = await realtime.respond()

    assert [e["type"] for e in committed] == [
        "input_audio_buffer.committed",
        "conversation.item.added",
        "conversation.item.done",
    ]
    assert committed[1]["item"]["content"] == [{"type": "input_audio", "transcript": None}]
    transcript = text_of(events, "response.output_audio_transcript.delta")
    assert "1.00 seconds of audio, dominant frequency about 440 Hz" in transcript
    speech = b"".join(base64.b64decode(e["delta"]) for e in events if e["type"] == "response.output_audio.delta")
    assert len(speech) > 24_000  # more than half a second of 24 kHz PCM16
    assert 200 <= dominant_hz(speech[:4800], 24_000) <= 700  # the first word's tone (tone voice: 220-660 Hz)
    types = [e["type"] for e in events]
    assert types[-6:-4] == ["response.output_audio.done", "response.output_audio_transcript.done"]
    assert events[-1]["response"]["status"] == "completed"
    assert events[-1]["response"]["output"][0]["content"][0] == {"type": "output_audio", "transcript": transcript}


async def test_each_response_is_given_the_earlier_items(realtime: Realtime) -> None:
    answers = []
    for question in ("one", "two", "three"):
        await add_user_text(realtime, question)
        events = await realtime.respond(output_modalities=["text"])
        answers.append(text_of(events, "response.output_text.delta"))

    assert "earlier conversation items" not in answers[0]
    assert "I was given 2 earlier conversation items." in answers[1]  # "one" and its answer
    assert "I was given 4 earlier conversation items." in answers[2]
    assert 'You asked: "three"' in answers[2]


async def test_cancel_ends_the_response_as_cancelled_and_aborts_the_engine(make_server: ServerFactory) -> None:
    server = await make_server(synthetic_ttft=30.0)
    async with connect(server) as rt:
        await add_user_text(rt, "Take your time.")
        await rt.send({"type": "response.create"})
        created = (await rt.until("response.created"))[-1]
        response_id = created["response"]["id"]
        await rt.send({"type": "response.cancel"})
        events = await rt.until("response.done")

        assert events[-1]["response"]["status"] == "cancelled"
        assert events[-1]["response"]["status_details"] == {"type": "cancelled", "reason": "client_cancelled"}
        assert events[-1]["response"]["output"] == []  # cancelled before the model said anything
        assert "response.output_item.added" not in [event["type"] for event in events]
        assert response_id in server.engine.recent_aborts
        await rt.send({"type": "response.cancel", "event_id": "late"})
        error = (await rt.until("error"))[-1]["error"]
        assert (error["code"], error["event_id"]) == ("response_cancel_not_active", "late")


async def test_items_are_retrieved_and_deleted_by_id(realtime: Realtime) -> None:
    await add_user_text(realtime, "remember me", id="msg_001")
    await realtime.send({"type": "conversation.item.retrieve", "item_id": "msg_001"})
    retrieved = (await realtime.until("conversation.item.retrieved"))[-1]["item"]
    await realtime.send({"type": "conversation.item.delete", "item_id": "msg_001"})
    deleted = (await realtime.until("conversation.item.deleted"))[-1]
    await realtime.send({"type": "conversation.item.retrieve", "item_id": "msg_001", "event_id": "evt_again"})
    error = (await realtime.until("error"))[-1]["error"]

    assert retrieved["id"] == "msg_001" and retrieved["content"] == [{"type": "input_text", "text": "remember me"}]
    assert deleted["item_id"] == "msg_001"
    assert (error["type"], error["code"], error["event_id"]) == ("invalid_request_error", "item_not_found", "evt_again")
    events = await realtime.respond(output_modalities=["text"])
    assert "earlier conversation items" not in text_of(events, "response.output_text.delta")  # it is gone


async def test_truncate_cuts_the_assistant_audio_and_its_transcript(realtime: Realtime) -> None:
    await add_user_text(realtime, "Say something long.")
    events = await realtime.respond()
    item_id = events[-1]["response"]["output"][0]["id"]
    full = events[-1]["response"]["output"][0]["content"][0]["transcript"]
    await realtime.send(
        {"type": "conversation.item.truncate", "item_id": item_id, "content_index": 0, "audio_end_ms": 300}
    )
    truncated = (await realtime.until("conversation.item.truncated"))[-1]
    await realtime.send({"type": "conversation.item.retrieve", "item_id": item_id})
    kept = (await realtime.until("conversation.item.retrieved"))[-1]["item"]["content"][0]["transcript"]

    assert (truncated["item_id"], truncated["audio_end_ms"]) == (item_id, 300)
    assert full.startswith(kept) and len(kept) < len(full) / 2


async def test_bad_input_gets_an_error_with_the_event_id_and_the_session_goes_on(realtime: Realtime) -> None:
    bad_events: list[Any] = [
        "{not json",
        {"type": "no.such.event", "event_id": "e1"},
        {"type": "input_audio_buffer.append", "audio": "%%%", "event_id": "e2"},
        {
            "type": "conversation.item.create",
            "event_id": "e3",
            "item": {
                "type": "message",
                "role": "user",
                "content": [{"type": "input_image", "image_url": "data:image/png;base64,AAAA"}],
            },
        },
        {
            "type": "conversation.item.create",
            "event_id": "e4",
            "item": {"type": "message", "role": "assistant", "content": [{"type": "input_text", "text": "x"}]},
        },
        {"type": "input_audio_buffer.commit", "event_id": "e5"},
        {"type": "session.update", "event_id": "e6", "session": {"output_modalities": ["text", "audio"]}},
        {"type": "session.update", "event_id": "e7", "session": {"audio": {"input": {"format": {"rate": 8000}}}}},
        {
            "type": "conversation.item.create",
            "event_id": "e8",
            "item": {
                "type": "message",
                "role": "user",
                "content": [{"type": "input_image", "image_url": png_data_url(RED, (4097, 4097))}],
            },
        },
    ]
    errors = []
    for bad in bad_events:
        await realtime.connection.send_raw(bad if isinstance(bad, str) else json.dumps(bad))
        errors.append((await realtime.until("error"))[-1]["error"])

    assert errors[0]["type"] == "invalid_request_error" and "JSON" in errors[0]["message"]
    assert [e["event_id"] for e in errors[1:]] == ["e1", "e2", "e3", "e4", "e5", "e6", "e7", "e8"]
    assert "pixels" in errors[8]["message"]
    assert errors[2]["param"] == "audio" and errors[3]["param"] == "item.content.0.image_url"
    assert errors[5]["code"] == "input_audio_buffer_commit_empty"
    events = await realtime.respond(output_modalities=["text"])
    assert events[-1]["response"]["status"] == "completed"


async def test_a_config_nested_too_deep_is_refused_and_later_updates_work(realtime: Realtime) -> None:
    """pydantic cannot echo a config 255 levels deep: before the parse-time bound, one such update
    made every later one fail with "Internal error"."""
    deep: Any = "x"
    for _ in range(300):
        deep = {"a": deep}
    await realtime.connection.send_raw(json.dumps({"type": "session.update", "session": {"x": deep}}))
    error = (await realtime.until("error"))[-1]["error"]
    assert error["event_id"] is None and "nested deeper than 64 levels" in error["message"]
    await realtime.send({"type": "session.update", "session": {"instructions": "Still here."}})
    assert (await realtime.until("session.updated"))[-1]["session"]["instructions"] == "Still here."
    events = await realtime.respond(output_modalities=["text"])
    assert events[-1]["response"]["status"] == "completed"


@pytest.mark.usefixtures("espeak_ng")  # skips without espeak-ng, fails under CI
async def test_server_vad_commits_each_utterance_and_answers_it(realtime: Realtime) -> None:
    await realtime.send(
        {"type": "session.update", "session": {"audio": {"input": {"turn_detection": {"type": "server_vad"}}}}}
    )
    updated = (await realtime.until("session.updated"))[-1]["session"]
    speech = speech24k("What colour is this?")
    await append_audio(realtime, bytes(24_000) + speech + bytes(48_000))
    events = await realtime.until("response.done")

    assert updated["audio"]["input"]["turn_detection"]["silence_duration_ms"] == 500
    types = [e["type"] for e in events]
    assert types[:5] == [
        "input_audio_buffer.speech_started",
        "input_audio_buffer.speech_stopped",
        "input_audio_buffer.committed",
        "conversation.item.added",
        "conversation.item.done",
    ]
    item_id = events[0]["item_id"]
    assert events[1]["item_id"] == events[2]["item_id"] == events[3]["item"]["id"] == item_id
    assert types[5] == "response.created" and events[-1]["response"]["status"] == "completed"
    heard = re.search(r"I heard ([\d.]+) seconds of audio", text_of(events, "response.output_audio_transcript.delta"))
    assert heard is not None and abs(float(heard.group(1)) - (len(speech) / 48_000 + 0.3)) <= 0.2  # + prefix padding


@pytest.mark.usefixtures("espeak_ng")  # skips without espeak-ng, fails under CI
async def test_speaking_over_the_answer_cancels_it_as_turn_detected(make_server: ServerFactory) -> None:
    server = await make_server(synthetic_ttft=30.0)
    async with connect(server) as rt:
        await add_user_text(rt, "Tell me everything.")
        await rt.send(
            {"type": "session.update", "session": {"audio": {"input": {"turn_detection": {"type": "semantic_vad"}}}}}
        )
        await rt.until("session.updated")
        await rt.send({"type": "response.create"})
        first = (await rt.until("response.created"))[-1]["response"]["id"]
        await append_audio(rt, speech24k("Stop, that is enough.") + bytes(48_000))
        events = await rt.until("input_audio_buffer.committed")

    done = next(e for e in events if e["type"] == "response.done")
    assert done["response"]["id"] == first and done["response"]["status"] == "cancelled"
    assert done["response"]["status_details"]["reason"] == "turn_detected"
    types = [e["type"] for e in events]
    assert types.index("input_audio_buffer.speech_started") < types.index("response.done")
    assert first in server.engine.recent_aborts


async def test_an_ephemeral_key_opens_one_session_with_its_config_and_no_server_token(
    make_server: ServerFactory,
) -> None:
    server = await make_server(auth_token="server-secret")
    backend = AsyncOpenAI(base_url=server.url + "/v1", api_key="server-secret")
    secret = await backend.realtime.client_secrets.create(
        expires_after={"anchor": "created_at", "seconds": 60},
        session={"type": "realtime", "instructions": "From the key.", "output_modalities": ["text"]},
    )
    await backend.close()
    browser = AsyncOpenAI(base_url=server.url + "/v1", api_key=secret.value)
    async with browser.realtime.connect(model="qwen3-omni") as connection:
        created = SERVER_EVENT.validate_json(await connection.recv_bytes())
    reused = browser.realtime.connect(model="qwen3-omni")
    with pytest.raises(Exception, match="401"):
        await reused.__aenter__()
    wrong = AsyncOpenAI(base_url=server.url + "/v1", api_key="not-the-token")
    with pytest.raises(openai.AuthenticationError):
        await wrong.realtime.client_secrets.create(session={"type": "realtime"})
    await browser.close()
    await wrong.close()

    assert secret.value.startswith("ek_") and secret.session.instructions == "From the key."
    assert created.type == "session.created"
    assert created.session.instructions == "From the key." and created.session.output_modalities == ["text"]


async def test_an_ephemeral_key_refused_at_max_sessions_is_not_used_up(make_server: ServerFactory) -> None:
    server = await make_server(max_sessions=1)
    backend = AsyncOpenAI(base_url=server.url + "/v1", api_key="sk-test")
    secret = await backend.realtime.client_secrets.create(session={"type": "realtime", "instructions": "Later."})
    await backend.close()
    browser = AsyncOpenAI(base_url=server.url + "/v1", api_key=secret.value)
    async with connect(server):  # the one place
        async with browser.realtime.connect(model="qwen3-omni") as refused:
            error = json.loads(await refused.recv_bytes())
    await wait_until(lambda: len(server.registry) == 0)
    async with browser.realtime.connect(model="qwen3-omni") as connection:
        created = SERVER_EVENT.validate_json(await connection.recv_bytes())
    await browser.close()

    assert error == {"type": "error", "message": "session limit of 1 reached"}
    assert created.type == "session.created" and created.session.instructions == "Later."


async def test_a_response_longer_than_the_idle_timeout_completes_then_idle_ends_the_session(
    make_server: ServerFactory,
) -> None:
    server = await make_server(idle_timeout=0.5, synthetic_ttft=1.5)
    async with connect(server) as rt:
        await add_user_text(rt, "Take longer than the idle timeout.")
        events = await rt.respond(output_modalities=["text"])
        error = (await rt.until("error"))[-1]["error"]

    assert events[-1]["response"]["status"] == "completed"
    assert error["code"] == "idle_timeout"


class CrashingEngine(SyntheticEngine):
    """Asked to crash, says a little and fails as a bug would; answers the rest."""

    async def generate(self, turn: UnderstandTurn) -> AsyncIterator[UnderstandOutput]:
        if "crash" in turn.query:
            yield TextDelta("partial")
            raise RuntimeError("model exploded")
        async for output in super().generate(turn):
            yield output


async def test_a_failing_response_is_logged_once_with_its_traceback_and_the_session_goes_on(
    make_server: ServerFactory, caplog: pytest.LogCaptureFixture
) -> None:
    server = await make_server(engine=CrashingEngine(ttft=0.01, token_rate=200, voice="tone"))
    async with connect(server) as rt:
        await add_user_text(rt, "Please crash.")
        with caplog.at_level(logging.WARNING, logger="rtc_omni"):
            done = (await rt.respond(output_modalities=["text"]))[-1]

        assert done["response"]["status"] == "failed"
        assert done["response"]["status_details"]["error"]["message"] == "The response failed"
        logged = [r for r in caplog.records if r.exc_info and "model exploded" in str(r.exc_info[1])]
        assert len(logged) == 1 and logged[0].exc_info is not None and logged[0].exc_info[2] is not None
        await add_user_text(rt, "Still there?")
        assert (await rt.respond(output_modalities=["text"]))[-1]["response"]["status"] == "completed"
