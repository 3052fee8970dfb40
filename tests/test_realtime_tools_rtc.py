"""Function calling on a WebRTC call (`/v1/realtime/calls`): the same events on the `oai-events`
DataChannel, a call that says nothing is silent on the track, and a tool's result never cuts into
the assistant's speech."""

from __future__ import annotations

from typing import Any

import pytest

from .conftest import ServerFactory
from .test_realtime_calls import Call
from .test_realtime_calls import call as call  # the fixture
from .test_realtime_tools import ASK, WEATHER

pytestmark = pytest.mark.media  # real aiortc peers and the talker


def user_text(text: str) -> dict[str, Any]:
    item = {"type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]}
    return {"type": "conversation.item.create", "item": item}


def output_of(call_id: str, output: str) -> dict[str, Any]:
    return {
        "type": "conversation.item.create",
        "item": {"type": "function_call_output", "call_id": call_id, "output": output},
    }


def types_from(call: Call, mark: int) -> list[str]:
    return [event["type"] for event in call.events[mark:]]


async def test_a_call_is_silent_and_the_spoken_answer_says_the_tools_result(
    make_server: ServerFactory,
    call: Call,
) -> None:
    server = await make_server(spoken_sentences=1)
    await call.connect(server, {"type": "realtime", "tools": [WEATHER]})
    call.send(user_text(ASK))
    call.send({"type": "response.create"})
    done = await call.wait("response.done")
    calling = types_from(call, 0)
    the_call = done["response"]["output"][0]
    mark = len(call.events)
    call.send(output_of(the_call["call_id"], "22C"))
    call.send({"type": "response.create"})
    answer = await call.wait("response.done", after=mark)

    assert the_call["type"] == "function_call" and the_call["name"] == "get_weather"
    assert "output_audio_buffer.started" not in calling and "response.output_audio_transcript.delta" not in calling
    assert "22C" in answer["response"]["output"][0]["content"][0]["transcript"]
    assert "output_audio_buffer.started" in types_from(call, mark)
    assert call.recorder is not None and call.recorder.voiced_frames() > 10


async def test_a_tools_result_sent_while_the_assistant_speaks_waits_for_the_speech_to_end(
    make_server: ServerFactory,
    call: Call,
) -> None:
    server = await make_server(spoken_sentences=2)  # about 4 s of speech
    await call.connect(server, {"type": "realtime", "tools": [WEATHER]})
    replay = {"type": "function_call", "call_id": "call_light", "name": "get_weather", "arguments": "{}"}
    call.send({"type": "conversation.item.create", "item": replay})
    call.send(user_text("Tell me what you see while I look it up."))
    call.send({"type": "response.create"})
    await call.wait("output_audio_buffer.started")
    await call.wait("response.output_audio_transcript.done")  # generated; its speech still plays
    mark = len(call.events)
    call.send(output_of("call_light", "22C"))
    call.send({"type": "response.create"})
    second = await call.wait("response.created", after=mark)
    answer = await call.wait("response.done", after=call.events.index(second))

    after = types_from(call, mark)
    assert "error" not in after
    assert after.index("output_audio_buffer.stopped") < after.index("response.created")
    first_done = next(e for e in call.events[mark:] if e["type"] == "response.done")
    assert first_done["response"]["status"] == "completed"  # played out whole, not cut
    assert "22C" in answer["response"]["output"][0]["content"][0]["transcript"]
