"""A LiveKit Agents voice agent run against rtc-omni, unchanged but for the model's base URL and key.

Runs in the framework's own environment (tests/agents/livekit/build.sh), started by
tests/test_agents_livekit.py. No LiveKit server is involved: an `AgentSession` started without a
room takes its audio from a microphone stand-in (`AudioInput`) and plays into a recorder
(`AudioOutput`), the two ends a room would otherwise provide. It runs one turn and prints what a user
would have seen and heard, as one JSON object:

    python agent.py BASE_URL text
    python agent.py BASE_URL speech SPEECH_PCM    # the user's speech, PCM16 mono 24 kHz
    python agent.py BASE_URL tool
"""

from __future__ import annotations

import asyncio
import json
import sys
from typing import Any

from livekit import rtc
from livekit.agents import Agent, AgentSession, function_tool, llm
from livekit.agents.voice import io
from livekit.plugins import openai

SAMPLE_RATE = 24_000
FRAME_SAMPLES = SAMPLE_RATE // 50  # 20 ms, as a microphone delivers it
TURN_TIMEOUT_S = 60.0


class Microphone(io.AudioInput):
    """The user's microphone: plays queued PCM16, then silence (rtc-omni's VAD ends the turn on it)."""

    def __init__(self) -> None:
        super().__init__(label="microphone")
        self._frames: asyncio.Queue[bytes] = asyncio.Queue()

    def say(self, pcm16: bytes, trailing_silence_s: float = 1.0) -> None:
        audio = pcm16 + bytes(2 * int(SAMPLE_RATE * trailing_silence_s))
        for start in range(0, len(audio), 2 * FRAME_SAMPLES):
            self._frames.put_nowait(audio[start : start + 2 * FRAME_SAMPLES])

    async def __anext__(self) -> rtc.AudioFrame:
        pcm = await self._frames.get()
        return rtc.AudioFrame(pcm, SAMPLE_RATE, 1, len(pcm) // 2)


class Loudspeaker(io.AudioOutput):
    """Where the agent's speech goes: counts the seconds played, as fast as they arrive."""

    def __init__(self) -> None:
        super().__init__(label="loudspeaker", capabilities=io.AudioOutputCapabilities(pause=False))
        self.played_s = 0.0
        self._segment_s = 0.0

    async def capture_frame(self, frame: rtc.AudioFrame) -> None:
        await super().capture_frame(frame)
        self._segment_s += frame.duration

    def flush(self) -> None:
        super().flush()
        self.played_s += self._segment_s
        self.on_playback_finished(playback_position=self._segment_s, interrupted=False)
        self._segment_s = 0.0

    def clear_buffer(self) -> None:
        self.played_s += self._segment_s
        self.on_playback_finished(playback_position=self._segment_s, interrupted=True)
        self._segment_s = 0.0


@function_tool
async def get_weather(city: str) -> str:
    """The current temperature in a city."""
    return "22C"


class Assistant(Agent):
    def __init__(self) -> None:
        super().__init__(instructions="You are a helpful voice assistant.", tools=[get_weather])


def transcript(item: llm.ChatItem) -> dict[str, Any]:
    if item.type == "message":
        return {"type": "message", "role": item.role, "text": item.text_content or ""}
    if item.type == "function_call":
        return {"type": "function_call", "name": item.name, "arguments": json.loads(item.arguments)}
    if item.type == "function_call_output":
        return {"type": "function_call_output", "output": item.output}
    return {"type": item.type}


async def typed_turn(session: AgentSession, user_input: str) -> None:
    await asyncio.wait_for(session.run(user_input=user_input), TURN_TIMEOUT_S)


async def spoken_turn(session: AgentSession, microphone: Microphone, speech: bytes) -> None:
    """rtc-omni's VAD hears the turn end and answers; its transcript may come after the answer, as
    OpenAI's may, so the turn is over once the conversation holds both."""
    added: asyncio.Queue[str] = asyncio.Queue()
    session.on("conversation_item_added", lambda event: added.put_nowait(getattr(event.item, "role", "")))
    microphone.say(speech)
    roles: set[str] = set()
    while {"user", "assistant"} - roles:
        roles.add(await asyncio.wait_for(added.get(), TURN_TIMEOUT_S))


async def main(base_url: str, turn: str, speech_path: str | None = None) -> None:
    microphone, loudspeaker = Microphone(), Loudspeaker()
    model = openai.realtime.RealtimeModel(base_url=base_url, api_key="rtc-omni")
    try:
        async with AgentSession(llm=model) as session:
            session.input.audio = microphone
            session.output.audio = loudspeaker
            await session.start(Assistant())
            if turn == "text":
                await typed_turn(session, "What colour is the sky?")
            elif turn == "speech" and speech_path is not None:
                with open(speech_path, "rb") as file:
                    await spoken_turn(session, microphone, file.read())
            elif turn == "tool":
                await typed_turn(session, 'Use get_weather for {"city": "Paris"}')
            else:
                raise SystemExit(__doc__)
            items = [transcript(item) for item in session.history.items]
    finally:
        await model.aclose()  # the HTTP session it opened for the WebSocket
    print(json.dumps({"items": items, "speech_played_s": loudspeaker.played_s}))


if __name__ == "__main__":
    asyncio.run(main(*sys.argv[1:]))
