"""A plain WebSocket client for the vLLM-Omni endpoints (aiohttp's), as a reference client would be."""

from __future__ import annotations

import asyncio
import base64
import io
import json
from collections.abc import Callable
from typing import Any

import aiohttp
import numpy as np
from PIL import Image


def jpeg_b64(colour: tuple[int, int, int], size: tuple[int, int] = (160, 120)) -> str:
    out = io.BytesIO()
    Image.new("RGB", size, colour).save(out, format="JPEG", quality=90)
    return base64.b64encode(out.getvalue()).decode("ascii")


def tone_pcm_b64(hz: float, seconds: float) -> str:
    t = np.arange(int(16_000 * seconds)) / 16_000
    return base64.b64encode((0.3 * np.sin(2 * np.pi * hz * t) * 32767).astype("<i2").tobytes()).decode("ascii")


class WsClient:
    """Collects every message: JSON events in `events`, binary messages in `binaries`, both in `log`."""

    def __init__(self, http: aiohttp.ClientSession, ws: aiohttp.ClientWebSocketResponse) -> None:
        self.http = http
        self.ws = ws
        self.log: list[dict[str, Any] | bytes] = []
        self._changed = asyncio.Event()
        self.closed = asyncio.Event()
        self._reader = asyncio.ensure_future(self._read())

    @classmethod
    async def connect(cls, url: str, headers: dict[str, str] | None = None) -> WsClient:
        http = aiohttp.ClientSession()
        ws = await http.ws_connect(url, max_msg_size=64 * 1024 * 1024, headers=headers)
        return cls(http, ws)

    @property
    def events(self) -> list[dict[str, Any]]:
        return [m for m in self.log if isinstance(m, dict)]

    @property
    def binaries(self) -> list[bytes]:
        return [m for m in self.log if isinstance(m, bytes)]

    async def _read(self) -> None:
        try:
            async for message in self.ws:
                if message.type == aiohttp.WSMsgType.TEXT:
                    self.log.append(json.loads(message.data))
                elif message.type == aiohttp.WSMsgType.BINARY:
                    self.log.append(message.data)
                self._changed.set()
        finally:
            self.closed.set()
            self._changed.set()

    async def send(self, message: dict[str, Any] | str | bytes) -> None:
        if isinstance(message, bytes):
            await self.ws.send_bytes(message)
        else:
            await self.ws.send_str(message if isinstance(message, str) else json.dumps(message))

    async def wait_event(
        self,
        type_: str | None = None,
        where: Callable[[dict[str, Any]], bool] | None = None,
        after: int = 0,
        timeout: float = 10.0,
    ) -> dict[str, Any]:
        """The first event at or after position `after` of `events` matching the type and predicate."""
        async with asyncio.timeout(timeout):
            while True:
                for event in self.events[after:]:
                    if (type_ is None or event["type"] == type_) and (where is None or where(event)):
                        return event
                if self.closed.is_set():
                    raise AssertionError(f"closed before {type_ or 'the event'}: {self.events[after:]}")
                self._changed.clear()
                await self._changed.wait()

    async def wait_closed(self, timeout: float = 10.0) -> None:
        async with asyncio.timeout(timeout):
            await self.closed.wait()

    @classmethod
    async def resume(
        cls, url: str, session_id: str, token: str, last_seq: int, headers: dict[str, str] | None = None, **extra: Any
    ) -> WsClient:
        """A new socket taking the session over (`url`: the endpoint the session was opened on)."""
        resume = {"session_id": session_id, "resume_token": token, "last_received_server_event_seq": last_seq}
        return await cls.resume_with(url, {"type": "session.resume", **resume, **extra}, headers)

    @classmethod
    async def resume_with(cls, url: str, message: dict[str, Any], headers: dict[str, str] | None = None) -> WsClient:
        """A `?resume=1` socket whose first message is `message`."""
        client = await cls.connect(url + ("&" if "?" in url else "?") + "resume=1", headers)
        await client.send(message)
        return client

    @property
    def last_seq(self) -> int:
        """The highest `server_event_seq` received (0: none)."""
        return max((e["server_event_seq"] for e in self.events if "server_event_seq" in e), default=0)

    def vanish(self) -> None:
        """Drop the connection with no closing handshake, as a network change does."""
        connection = self.ws._response.connection
        assert connection is not None and connection.transport is not None
        connection.transport.abort()

    async def close(self) -> None:
        await self.ws.close()
        self._reader.cancel()
        await asyncio.gather(self._reader, return_exceptions=True)
        await self.http.close()
