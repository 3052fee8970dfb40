"""Re-measure issue 35's attacks on `WS /v1/realtime` (items 1-3), each against a fresh server.

  - echo: 24 `conversation.item.retrieve` events with a 15 MiB unknown `item_id` (360 MiB), sent
    without reading a byte;
  - not-reading: 48 retrieves of a 4 MiB item (192 MiB of answers), sent the same way;
  - text: 48 user items of 4 MiB `input_text`, read as a client reads;
  - config: 24 `session.update`s of 4 MiB of unknown keys, read as a client reads.

For each: the server's resident memory over its start (peak, and where it stands while the socket is
still open), its CPU seconds, what came back, and how the socket ended. The server is
`rtc-omni serve` (synthetic engine) in a subprocess on 127.0.0.1.
Usage: python benchmarks/realtime_bounds.py [--only echo|not-reading|text|config]
Run it inside a loopback-only network namespace, like the tests.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import aiohttp

from rtc_omni.bench.common import process_cpu_seconds, server

MiB = 2**20
SAMPLE_S = 0.05
SETTLE_S = 3.0  # a non-reading client's wait, while the server answers
READ_TIMEOUT_S = 60.0
QUIET_S = 5.0  # a socket that sends nothing for this long is still open, and idle


def rss_bytes(pid: int) -> int:
    with open(f"/proc/{pid}/status") as status:
        return next(int(line.split()[1]) * 1024 for line in status if line.startswith("VmRSS:"))


@dataclass
class Figures:
    pid: int
    rss0: int = 0
    peak: int = 0
    cpu0: float = 0.0
    notes: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.rss0 = self.peak = rss_bytes(self.pid)
        self.cpu0 = process_cpu_seconds(self.pid)

    async def sample(self) -> None:
        while True:
            self.peak = max(self.peak, rss_bytes(self.pid))
            await asyncio.sleep(SAMPLE_S)

    def mark(self, name: str) -> None:
        """The server's growth and CPU so far, under `name`."""
        self.notes[name] = f"+{(rss_bytes(self.pid) - self.rss0) / MiB:.0f} MiB"

    def report(self, attack: str) -> str:
        cpu = process_cpu_seconds(self.pid) - self.cpu0
        notes = ", ".join(f"{key} {value}" for key, value in self.notes.items())
        return f"{attack}: peak +{(self.peak - self.rss0) / MiB:.0f} MiB, {cpu:.1f} CPU-s; {notes}"


async def read_all(ws: aiohttp.ClientWebSocketResponse) -> tuple[int, int, str]:
    """Everything the server sends until the socket ends or goes quiet: events, their bytes, and how
    it ended."""
    events = size = 0
    try:
        while (message := await ws.receive(timeout=QUIET_S)).type == aiohttp.WSMsgType.TEXT:
            events, size = events + 1, size + len(message.data)
    except TimeoutError:
        return events, size, f"still open ({QUIET_S:.0f} s quiet)"
    return events, size, f"{message.type.name} {message.data} {message.extra or ''}".strip()


async def read_until(ws: aiohttp.ClientWebSocketResponse, event_type: str) -> int:
    """Bytes read up to and including the next `event_type` event."""
    size = 0
    async with asyncio.timeout(READ_TIMEOUT_S):
        while True:
            message = await ws.receive()
            if message.type != aiohttp.WSMsgType.TEXT:
                raise ConnectionError(f"socket ended before {event_type}: {message.type.name} {message.data}")
            size += len(message.data)
            if json.loads(message.data)["type"] == event_type:
                return size


def user_text(text: str, item_id: str) -> dict[str, Any]:
    item = {"type": "message", "role": "user", "id": item_id, "content": [{"type": "input_text", "text": text}]}
    return {"type": "conversation.item.create", "item": item}


async def echo(ws: aiohttp.ClientWebSocketResponse, figures: Figures) -> None:
    unknown = "x" * (15 * MiB)
    for _ in range(24):
        await ws.send_json({"type": "conversation.item.retrieve", "item_id": unknown})
    await stop_reading(ws, figures)


async def not_reading(ws: aiohttp.ClientWebSocketResponse, figures: Figures) -> None:
    await ws.send_json(user_text("x" * (4 * MiB), "big"))
    for _ in range(48):
        await ws.send_json({"type": "conversation.item.retrieve", "item_id": "big"})
    await stop_reading(ws, figures)


async def stop_reading(ws: aiohttp.ClientWebSocketResponse, figures: Figures) -> None:
    """Read nothing while the server answers, then read what it still sends, and how the socket ends."""
    await asyncio.sleep(SETTLE_S)
    figures.mark("held with the socket open")
    events, size, ended = await read_all(ws)
    figures.notes["then read"] = f"{events} events, {size / MiB:.0f} MiB, ended {ended}"


async def text(ws: aiohttp.ClientWebSocketResponse, figures: Figures) -> None:
    big = "x" * (4 * MiB)
    for n in range(48):
        await ws.send_json(user_text(big, f"item_{n}"))
        await read_until(ws, "conversation.item.done")
    figures.mark("after 48 items")
    await ws.send_json({"type": "conversation.item.retrieve", "item_id": "item_0"})
    answer = await ws.receive_json(timeout=READ_TIMEOUT_S)  # a reading client has nothing else waiting
    figures.notes["item_0"] = answer.get("error", {}).get("code") or answer["type"]


async def config(ws: aiohttp.ClientWebSocketResponse, figures: Figures) -> None:
    echoed = 0
    for n in range(24):
        junk = {f"junk_{n}_{k}": "x" * 1024 for k in range(4 * 1024)}  # 4 MiB of unknown keys
        await ws.send_json({"type": "session.update", "session": junk})
        echoed += await read_until(ws, "session.updated")
    figures.notes["echoed"] = f"{echoed / MiB:.1f} MiB"
    figures.mark("after 24 updates")


ATTACKS: dict[str, Callable[[aiohttp.ClientWebSocketResponse, Figures], Awaitable[None]]] = {
    "echo": echo,
    "not-reading": not_reading,
    "text": text,
    "config": config,
}


async def run(name: str) -> str:
    with server() as (process, url):
        figures = Figures(process.pid)
        sampler = asyncio.ensure_future(figures.sample())
        started = time.monotonic()
        async with aiohttp.ClientSession() as http:
            async with http.ws_connect(url.replace("http", "ws") + "/v1/realtime", max_msg_size=0) as ws:
                await read_until(ws, "session.created")
                await ATTACKS[name](ws, figures)
        sampler.cancel()
        figures.notes["wall"] = f"{time.monotonic() - started:.1f} s"
        return figures.report(name)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", choices=sorted(ATTACKS))
    args = parser.parse_args()
    for name in [args.only] if args.only else list(ATTACKS):
        print(asyncio.run(run(name)), flush=True)


if __name__ == "__main__":
    main()
