"""A voice agent built with openai-agents (`RealtimeAgent` + `RealtimeRunner`, WebSocket), pointed at
a server under test by its URL and key only; run in the framework's own environment by
tests/test_agents_openai_agents.py:

    python voice_agent.py ws://127.0.0.1:PORT/v1/realtime SPEECH_PCM16_24KHZ_FILE

Three turns in one session, each printed as one JSON line of what the agent's user sees: a typed
question, a spoken one (the server's VAD ends the turn, as with a microphone) and a tool round trip.
"""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import AsyncIterator
from typing import Any

from agents import function_tool, set_tracing_disabled
from agents.realtime import RealtimeAgent, RealtimeRunner, RealtimeSession, RealtimeSessionEvent

set_tracing_disabled(True)  # the SDK's traces go to api.openai.com otherwise

TURN_TIMEOUT_S = 30.0  # for each event, so a missing one fails the run instead of hanging it
CHUNK_BYTES = 4800  # 100 ms of PCM16 mono 24 kHz, as a microphone streams it
TRAILING_SILENCE_S = 1.5  # longer than semantic_vad's end-of-turn silence


@function_tool
def get_weather(city: str) -> str:
    """The current weather in a city."""
    return "22C"


class Conversation:
    """The session's events as the app sees them, and the history they build."""

    def __init__(self, session: RealtimeSession) -> None:
        self.session = session
        self.events: AsyncIterator[RealtimeSessionEvent] = session.__aiter__()
        self.history: list[Any] = []

    async def until(self, *kinds: str) -> RealtimeSessionEvent:
        """The next event of one of these types, keeping the history up to date on the way."""
        while True:
            try:
                event = await asyncio.wait_for(anext(self.events), TURN_TIMEOUT_S)
            except TimeoutError:
                raise RuntimeError(f"no {' or '.join(kinds)} event; the newest answer: {self.answer()!r}") from None
            if event.type == "history_updated":
                self.history = list(event.history)
            elif event.type == "history_added":
                self.history = [item for item in self.history if item.item_id != event.item.item_id]
                self.history.append(event.item)
            elif event.type == "error":
                raise RuntimeError(f"the session reported an error: {event.error}")
            if event.type in kinds:
                return event

    def answer(self) -> str:
        """The newest assistant message's words (its audio transcript or text)."""
        for item in reversed(self.history):
            if item.type == "message" and item.role == "assistant":
                return " ".join((part.transcript if part.type == "audio" else part.text) or "" for part in item.content)
        return ""

    def user_transcripts(self) -> list[str | None]:
        return [
            part.transcript
            for item in self.history
            if item.type == "message" and item.role == "user"
            for part in item.content
            if part.type == "input_audio"
        ]


async def text_turn(conversation: Conversation) -> dict[str, Any]:
    await conversation.session.send_message("What colour is the sky?")
    await conversation.until("agent_end")
    return {"turn": "text", "answer": conversation.answer()}


async def audio_turn(conversation: Conversation, speech: bytes) -> dict[str, Any]:
    microphone = speech + bytes(int(TRAILING_SILENCE_S * 24_000) * 2)
    for start in range(0, len(microphone), CHUNK_BYTES):
        await conversation.session.send_audio(microphone[start : start + CHUNK_BYTES])
    await conversation.until("agent_end")
    answer = conversation.answer()
    while not any(conversation.user_transcripts()):  # the transcript comes beside the answer
        await conversation.until("history_updated")
    return {"turn": "audio", "answer": answer, "transcript": conversation.user_transcripts()[-1]}


async def tool_turn(conversation: Conversation) -> dict[str, Any]:
    await conversation.session.send_message('Use get_weather for {"city": "Paris"}')
    # The framework runs the tool in a task of its own: the call's response may end before or after
    # the tool starts, and the tool's end is reported after its output is sent, so the response that
    # answers the output (the first to start after the tool) may start before or after that.
    start = await conversation.until("tool_start")
    waiting = {"tool_end", "agent_start"}
    while waiting:
        event = await conversation.until(*waiting)
        waiting.discard(event.type)
        if event.type == "tool_end":
            output = event.output
    await conversation.until("agent_end")
    return {
        "turn": "tool",
        "tool": start.tool.name,
        "arguments": json.loads(start.arguments),
        "output": output,
        "answer": conversation.answer(),
    }


async def main(url: str, speech_file: str) -> None:
    with open(speech_file, "rb") as file:
        speech = file.read()
    agent = RealtimeAgent(name="Assistant", instructions="You are a helpful voice assistant.", tools=[get_weather])
    runner = RealtimeRunner(agent, config={"tracing_disabled": True})
    async with await runner.run(model_config={"url": url, "api_key": "TOKEN"}) as session:
        conversation = Conversation(session)
        print(json.dumps(await text_turn(conversation)), flush=True)
        print(json.dumps(await audio_turn(conversation, speech)), flush=True)
        print(json.dumps(await tool_turn(conversation)), flush=True)


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2]))
