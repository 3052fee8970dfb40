"""Function calling and out-of-band responses on `WS /v1/realtime`, with the official `openai` SDK.

The synthetic engine calls the first offered tool whose name is in the user's text, with the first
JSON object in that text as the arguments, and after a tool's output says what the tool returned
(rtc_omni/engines/synthetic.py), so every event of a call can be checked here. Every event is
validated against the SDK's own server-event union (tests/realtime_client.py).
"""

from __future__ import annotations

import json
from typing import Any

from rtc_omni.engines import SyntheticEngine

from .conftest import RunningServer, ServerFactory
from .realtime_client import Realtime, add_user_text, append_audio, connect, speech24k, text_of

WEATHER = {
    "type": "function",
    "name": "get_weather",
    "description": "The weather in a city now.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
}
TIME = {"type": "function", "name": "get_time", "description": "The time now.", "parameters": {"type": "object"}}
ASK = 'Use get_weather for {"city": "Paris"}, please.'


async def with_tools(rt: Realtime, *tools: dict[str, Any], **session: Any) -> dict[str, Any]:
    await rt.send(
        {"type": "session.update", "session": {"output_modalities": ["text"], "tools": list(tools), **session}}
    )
    return (await rt.until("session.updated"))[-1]["session"]


def types(events: list[dict[str, Any]]) -> list[str]:
    return [event["type"] for event in events]


def the_call(events: list[dict[str, Any]]) -> dict[str, Any]:
    return next(e for e in events if e["type"] == "response.function_call_arguments.done")


async def answer_call(rt: Realtime, call_id: str, output: str) -> list[dict[str, Any]]:
    item = {"type": "function_call_output", "call_id": call_id, "output": output}
    await rt.send({"type": "conversation.item.create", "item": item})
    await rt.until("conversation.item.done")
    return await rt.respond()


async def test_a_tool_round_trip_in_openai_order_and_the_answer_holds_the_tools_result(server: RunningServer) -> None:
    async with connect(server) as rt:
        await with_tools(rt, WEATHER)
        await add_user_text(rt, ASK)
        events = await rt.respond()
        call = the_call(events)
        deltas = "".join(e["delta"] for e in events if e["type"] == "response.function_call_arguments.delta")
        after = await answer_call(rt, call["call_id"], "22C")
        await rt.send({"type": "conversation.item.retrieve", "item_id": call["item_id"]})
        retrieved = (await rt.until("conversation.item.retrieved"))[-1]["item"]

    assert types(events)[:3] == ["response.created", "response.output_item.added", "conversation.item.added"]
    assert types(events)[-4:] == [
        "response.function_call_arguments.done",
        "response.output_item.done",
        "conversation.item.done",
        "response.done",
    ]
    assert set(types(events)[3:-4]) == {"response.function_call_arguments.delta"}
    added = events[1]["item"]
    assert (added["type"], added["name"], added["call_id"]) == ("function_call", "get_weather", call["call_id"])
    assert json.loads(deltas) == json.loads(call["arguments"]) == {"city": "Paris"}
    done = events[-1]["response"]
    assert done["status"] == "completed" and [item["type"] for item in done["output"]] == ["function_call"]
    assert done["output"][0]["arguments"] == call["arguments"]
    assert "response.output_text.delta" not in types(events)  # a call-only response says nothing
    assert "22C" in text_of(after, "response.output_text.delta")
    assert (retrieved["name"], retrieved["call_id"], retrieved["arguments"]) == (
        "get_weather",
        call["call_id"],
        call["arguments"],
    )


async def test_tool_choice_none_required_and_named(server: RunningServer) -> None:
    async with connect(server) as rt:
        await with_tools(rt, WEATHER, TIME, tool_choice="none")
        await add_user_text(rt, ASK)
        none = await rt.respond()
        required = await rt.respond(tool_choice="required")
        named = await rt.respond(tool_choice={"type": "function", "name": "get_time"})
        await add_user_text(rt, "Nothing to call here.")
        auto_without_name = await rt.respond(tool_choice="auto")

    assert "response.function_call_arguments.done" not in types(none)
    assert the_call(required)["name"] == "get_weather"  # the tool the text names
    assert the_call(named)["name"] == "get_time"
    assert "response.function_call_arguments.done" not in types(auto_without_name)


async def test_response_tools_apply_to_that_response_only(server: RunningServer) -> None:
    async with connect(server) as rt:
        await rt.send({"type": "session.update", "session": {"output_modalities": ["text"]}})
        await rt.until("session.updated")
        await add_user_text(rt, ASK)
        with_tool = await rt.respond(tools=[WEATHER])
        without = await rt.respond()

    assert the_call(with_tool)["name"] == "get_weather"
    assert "response.function_call_arguments.done" not in types(without)


async def test_bad_outputs_and_bad_tools_get_errors_and_the_session_goes_on(server: RunningServer) -> None:
    async with connect(server) as rt:
        await with_tools(rt, WEATHER)
        await add_user_text(rt, ASK)
        call_id = the_call(await rt.respond())["call_id"]
        errors = []
        for event_id, item in [
            ("evt_unknown", {"type": "function_call_output", "call_id": "call_nope", "output": "x"}),
            ("evt_number", {"type": "function_call_output", "call_id": call_id, "output": 22}),
        ]:
            await rt.send({"type": "conversation.item.create", "event_id": event_id, "item": item})
            errors.append((await rt.until("error"))[-1]["error"])
        answered = await answer_call(rt, call_id, "22C")
        await rt.send(
            {
                "type": "conversation.item.create",
                "event_id": "evt_twice",
                "item": {"type": "function_call_output", "call_id": call_id, "output": "23C"},
            }
        )
        errors.append((await rt.until("error"))[-1]["error"])
        for event_id, tool in [
            ("evt_name", {**WEATHER, "name": "get weather!"}),
            ("evt_schema", {**WEATHER, "parameters": {"type": "string"}}),
            ("evt_kind", {**WEATHER, "type": "mcp"}),
        ]:
            await rt.send({"type": "session.update", "event_id": event_id, "session": {"tools": [tool]}})
            errors.append((await rt.until("error"))[-1]["error"])
        await rt.send(
            {
                "type": "session.update",
                "event_id": "evt_choice",
                "session": {"tool_choice": {"type": "function", "name": "nope"}},
            }
        )
        errors.append((await rt.until("error"))[-1]["error"])
        await add_user_text(rt, ASK)
        still = the_call(await rt.respond())  # the previous tools stayed

    assert [(e["event_id"], e["param"]) for e in errors] == [
        ("evt_unknown", "item.call_id"),
        ("evt_number", "item.output"),
        ("evt_twice", "item.call_id"),
        ("evt_name", "session.tools.0.name"),
        ("evt_schema", "session.tools.0.parameters"),
        ("evt_kind", "session.tools.0.type"),
        ("evt_choice", "session.tool_choice"),
    ]
    assert "call_nope" in errors[0]["message"] and "already has an output" in errors[2]["message"]
    assert "22C" in text_of(answered, "response.output_text.delta")
    assert still["name"] == "get_weather"


async def test_cancel_during_the_arguments_still_closes_the_call(make_server: ServerFactory) -> None:
    server = await make_server(synthetic_token_rate=20.0)  # 8 characters of arguments per 50 ms
    long_city = "Llanfair" * 40
    async with connect(server) as rt:
        await with_tools(rt, WEATHER)
        await add_user_text(rt, f'Use get_weather for {{"city": "{long_city}"}}')
        await rt.send({"type": "response.create"})
        await rt.until("response.function_call_arguments.delta")
        await rt.send({"type": "response.cancel"})
        events = await rt.until("response.done")

    call = the_call(events)
    assert types(events).index("response.function_call_arguments.done") < types(events).index("response.done")
    assert events[-1]["response"]["status"] == "cancelled"
    assert events[-1]["response"]["output"][0]["status"] == "incomplete"
    assert 0 < len(call["arguments"]) < len(json.dumps({"city": long_city}))


async def test_history_replay_puts_a_call_and_its_output_where_the_client_says(server: RunningServer) -> None:
    async with connect(server) as rt:
        await with_tools(rt, WEATHER)
        first = await add_user_text(rt, "What is the weather in Paris?")
        await rt.send(
            {
                "type": "conversation.item.create",
                "previous_item_id": first["id"],
                "item": {"type": "function_call", "call_id": "call_old", "name": "get_weather", "arguments": "{}"},
            }
        )
        replayed = (await rt.until("conversation.item.done"))[-1]
        await rt.send(
            {
                "type": "conversation.item.create",
                "event_id": "evt_again",
                "item": {"type": "function_call", "call_id": "call_old", "name": "get_weather", "arguments": "{}"},
            }
        )
        duplicate = (await rt.until("error"))[-1]["error"]
        answer = await answer_call(rt, "call_old", "18C and raining")

    assert replayed["previous_item_id"] == first["id"] and replayed["item"]["call_id"] == "call_old"
    assert duplicate["event_id"] == "evt_again"
    assert "18C and raining" in text_of(answer, "response.output_text.delta")


async def test_an_out_of_band_response_leaves_the_conversation_alone_and_returns_its_metadata(
    server: RunningServer,
) -> None:
    async with connect(server) as rt:
        await rt.send({"type": "session.update", "session": {"output_modalities": ["text"]}})
        await rt.until("session.updated")
        kept = await add_user_text(rt, "Remember the blue door.")
        await rt.send({"type": "conversation.item.retrieve", "item_id": kept["id"]})
        await rt.until("conversation.item.retrieved")
        out_of_band = await rt.respond(
            conversation="none",
            metadata={"purpose": "classify"},
            instructions="Classify the topic.",
            input=[
                {"type": "item_reference", "id": kept["id"]},
                {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Only this."}]},
            ],
        )
        in_conversation = await rt.respond()

    done = out_of_band[-1]["response"]
    assert done["metadata"] == {"purpose": "classify"} and done["conversation_id"] is None
    assert "conversation.item.added" not in types(out_of_band)
    assert 'You asked: "Remember the blue door. Only this."' in text_of(out_of_band, "response.output_text.delta")
    # The conversation never saw the out-of-band answer: the next response has no earlier items.
    assert "earlier conversation items" not in text_of(in_conversation, "response.output_text.delta")
    assert in_conversation[-1]["response"]["conversation_id"].startswith("conv_")


async def test_a_remote_engine_reports_tools_unavailable(make_server: ServerFactory) -> None:
    class Plain(SyntheticEngine):
        """The synthetic engine without the tool-calling capability, as the remote engine is."""

        calls_tools = False

    server = await make_server(engine=Plain())
    async with connect(server) as rt:
        await rt.send({"type": "session.update", "event_id": "evt_tools", "session": {"tools": [WEATHER]}})
        events = await rt.until("error")

    updated = next(e for e in events if e["type"] == "session.updated")["session"]
    error = events[-1]["error"]
    assert updated["tools"] == []
    assert (error["code"], error["param"], error["event_id"]) == ("tools_unavailable", "session.tools", "evt_tools")


async def test_speech_while_a_tool_runs_waits_for_its_output_instead_of_answering_over_it(
    server: RunningServer, espeak_ng: str
) -> None:
    vad = {"type": "server_vad", "silence_duration_ms": 300}
    async with connect(server) as rt:
        await with_tools(rt, WEATHER, audio={"input": {"turn_detection": vad}})
        await add_user_text(rt, ASK)
        call_id = the_call(await rt.respond())["call_id"]
        await append_audio(rt, speech24k("And tomorrow?") + bytes(24_000))
        heard = await rt.until("input_audio_buffer.committed")
        quiet = await rt.until_quiet(1.0)  # an automatic response would have started by now
        answered = await answer_call(rt, call_id, "22C")
        await append_audio(rt, speech24k("Thank you.") + bytes(24_000))
        after_output = await rt.until("response.done")  # with no call waiting, speech is answered again

    assert "response.created" not in types(heard + quiet)
    assert "22C" in text_of(answered, "response.output_text.delta")
    assert "earlier conversation items" in text_of(answered, "response.output_text.delta")
    assert "response.created" in types(after_output)
