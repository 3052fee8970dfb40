"""The official `openai` SDK's realtime connection as the tests drive it, every server event validated
against the SDK's own typed union, and the audio an app appends."""

from __future__ import annotations

import asyncio
import base64
from typing import Any

import numpy as np
from openai import AsyncOpenAI
from openai.types.realtime import RealtimeServerEvent
from pydantic import TypeAdapter

from rtc_omni.client.media import speech48

from .conftest import RunningServer

SERVER_EVENT: TypeAdapter[Any] = TypeAdapter(RealtimeServerEvent)
EVENT_TIMEOUT_S = 20.0


def tone_pcm24k(hz: float, seconds: float) -> bytes:
    t = np.arange(int(24_000 * seconds)) / 24_000
    return (0.3 * np.sin(2 * np.pi * hz * t) * 32767).astype("<i2").tobytes()


def speech24k(text: str) -> bytes:
    """espeak-ng saying `text`, as the 24 kHz PCM16 an app streams."""
    return (speech48(text)[::2] * 32767).astype("<i2").tobytes()


class Realtime:
    """One SDK connection; every event received is validated as the SDK's typed server event."""

    def __init__(self, connection: Any) -> None:
        self.connection = connection
        self.events: list[dict[str, Any]] = []

    async def send(self, event: dict[str, Any]) -> None:
        await self.connection.send(event)

    async def next(self) -> dict[str, Any]:
        async with asyncio.timeout(EVENT_TIMEOUT_S):
            raw = await self.connection.recv_bytes()
        typed = SERVER_EVENT.validate_json(raw)  # raises on any event the SDK's models reject
        event = typed.model_dump(mode="json", exclude_unset=True)
        self.events.append(event)
        return event

    async def until(self, event_type: str) -> list[dict[str, Any]]:
        """Events up to and including the next `event_type`."""
        seen = []
        while True:
            event = await self.next()
            seen.append(event)
            if event["type"] == event_type:
                return seen

    async def until_quiet(self, seconds: float) -> list[dict[str, Any]]:
        """Events until none arrives for `seconds`: for what must not happen."""
        seen = []
        while True:
            try:
                async with asyncio.timeout(seconds):
                    raw = await self.connection.recv_bytes()
            except TimeoutError:
                return seen
            event = SERVER_EVENT.validate_json(raw).model_dump(mode="json", exclude_unset=True)
            self.events.append(event)
            seen.append(event)

    async def respond(self, **response: Any) -> list[dict[str, Any]]:
        await self.send({"type": "response.create", **({"response": response} if response else {})})
        return await self.until("response.done")


class connect:
    """`AsyncOpenAI(base_url=...).realtime.connect(model=...)`, as an app would open it."""

    def __init__(self, server: RunningServer) -> None:
        self.client = AsyncOpenAI(base_url=server.url + "/v1", api_key="sk-test")
        self.manager = self.client.realtime.connect(model="qwen3-omni")

    async def __aenter__(self) -> Realtime:
        session = Realtime(await self.manager.__aenter__())
        created = await session.next()
        assert created["type"] == "session.created"
        return session

    async def __aexit__(self, *exc: object) -> None:
        await self.manager.__aexit__(None, None, None)
        await self.client.close()


def text_of(events: list[dict[str, Any]], delta_type: str) -> str:
    return "".join(e["delta"] for e in events if e["type"] == delta_type)


async def add_user_text(rt: Realtime, text: str, **item: Any) -> dict[str, Any]:
    await rt.send(
        {
            "type": "conversation.item.create",
            "item": {"type": "message", "role": "user", "content": [{"type": "input_text", "text": text}], **item},
        }
    )
    events = await rt.until("conversation.item.done")
    return events[-1]["item"]


async def append_audio(rt: Realtime, pcm: bytes) -> None:
    for start in range(0, len(pcm), 9600):  # 200 ms appends
        await rt.send(
            {"type": "input_audio_buffer.append", "audio": base64.b64encode(pcm[start : start + 9600]).decode()}
        )
