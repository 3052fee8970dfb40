"""The tool round trip's two waits on `WS /v1/realtime`, as an agent framework sees them.

  - call: `response.create` -> `response.function_call_arguments.done` (the app can run its tool);
  - answer: the `function_call_output` item sent -> the first `response.output_audio.delta` of the
    spoken answer that follows (the user hears the tool's result).

Each of N rounds asks in text for `get_weather` with `{"city": "Paris"}`, answers the call with
"22C" and waits for the answer's `response.done`. The server is `rtc-omni serve` (synthetic
engine, its default timing: 150 ms to the first token, 40 tokens/s, espeak-ng or tone speech) in a
subprocess on 127.0.0.1; the client is the official `openai` SDK. Prints p50/p95 of both.
Usage: python benchmarks/realtime_tools.py [--rounds 30]
Run it inside a loopback-only network namespace, like the tests.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from typing import Any

from openai import AsyncOpenAI

from rtc_omni.bench.common import server, stats_ms

WEATHER = {
    "type": "function",
    "name": "get_weather",
    "description": "The weather in a city now.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
}
EVENT_TIMEOUT_S = 60.0


async def until(connection: Any, event_type: str) -> dict[str, Any]:
    async with asyncio.timeout(EVENT_TIMEOUT_S):
        async for event in connection:
            if event.type == "error":
                raise RuntimeError(f"server error: {event.error.message}")
            if event.type == event_type:
                return event.model_dump()
    raise RuntimeError("the connection closed")


async def rounds(url: str, count: int) -> tuple[list[float], list[float]]:
    client = AsyncOpenAI(base_url=url + "/v1", api_key="sk-bench")
    calls: list[float] = []
    answers: list[float] = []
    async with client.realtime.connect(model="qwen3-omni") as connection:
        await connection.session.update(session={"type": "realtime", "tools": [WEATHER]})  # type: ignore[typeddict-item]
        await until(connection, "session.updated")
        for _ in range(count):
            text = 'Use get_weather for {"city": "Paris"}.'
            await connection.conversation.item.create(
                item={"type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]}
            )
            await until(connection, "conversation.item.done")
            asked = time.perf_counter()
            await connection.response.create()
            call = await until(connection, "response.function_call_arguments.done")
            calls.append(time.perf_counter() - asked)
            assert json.loads(call["arguments"]) == {"city": "Paris"}
            await until(connection, "response.done")
            answered = time.perf_counter()
            await connection.conversation.item.create(
                item={"type": "function_call_output", "call_id": call["call_id"], "output": "22C"}
            )
            await connection.response.create()
            await until(connection, "response.output_audio.delta")
            answers.append(time.perf_counter() - answered)
            await until(connection, "response.done")
    await client.close()
    return calls, answers


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=30)
    args = parser.parse_args()
    with server() as (_process, url):
        calls, answers = asyncio.run(rounds(url, args.rounds))
    print(f"{args.rounds} tool round trips, synthetic engine, WebSocket, one session")
    print("response.create -> function_call_arguments.done (ms):", stats_ms(calls))
    print("function_call_output -> first output_audio.delta (ms):", stats_ms(answers))


if __name__ == "__main__":
    main()
