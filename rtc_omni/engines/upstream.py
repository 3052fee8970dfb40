"""The upstream servers a remote engine forwards to: choice by load, health checks, failover.

Each request (a turn or a generation) opens its own WebSocket to one endpoint path of one upstream.
The pool picks the healthy upstream with the fewest open requests; an upstream that refused a
connection or dropped one mid-request is skipped for `retry_s`, then tried again. Besides these
passive checks, the pool polls each upstream's HTTP health endpoint (`/health`, which vLLM's and
vLLM-Omni's servers and ours answer) every `health_interval_s`, so a dead upstream is skipped
before a session lands on it and a recovered one comes back without waiting for `retry_s`. When every
upstream is marked down, they are all tried anyway (soonest back first), so a fleet that recovers
is used again without a restart. A server that answers that it does not serve the endpoint (one
model per vLLM-Omni server) is tried last from then on, so understanding and generation servers
can share one `--upstream` list.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass

import aiohttp

from .base import EngineError

DEFAULT_MAX_MESSAGE_BYTES = 64 * 1024 * 1024  # the largest kind: one generated fMP4 chunk


@dataclass
class Upstream:
    url: str  # ws://HOST:PORT
    active: int = 0
    failures: int = 0
    down_until: float = 0.0
    serves: bool = True  # False once it answered that it does not serve this endpoint

    @property
    def healthy(self) -> bool:
        return time.monotonic() >= self.down_until


class UpstreamPool:
    """The upstreams of one endpoint path (understanding and generation are judged apart)."""

    def __init__(
        self,
        urls: list[str],
        path: str,
        retry_s: float,
        connect_timeout_s: float,
        health_interval_s: float = 5.0,
        max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
    ) -> None:
        """`max_message_bytes`: the largest message an upstream of this endpoint may send; aiohttp
        fails the connection at that size before buffering more."""
        if not urls:
            raise ValueError("the remote engine needs at least one --upstream ws://HOST:PORT")
        self.upstreams = [Upstream(url) for url in urls]
        self.path = path
        self.retry_s = retry_s
        self.connect_timeout_s = connect_timeout_s
        self.health_interval_s = health_interval_s
        self.max_message_bytes = max_message_bytes
        self._http: aiohttp.ClientSession | None = None
        self._health_task: asyncio.Task[None] | None = None

    def _session(self) -> aiohttp.ClientSession:
        if self._http is None:
            self._http = aiohttp.ClientSession()
        if self._health_task is None and self.health_interval_s > 0:
            self._health_task = asyncio.get_running_loop().create_task(self._watch_health())
        return self._http

    async def check_health(self) -> None:
        """One round of health checks: a failed or non-200 `/health` marks the upstream down."""
        http = self._session()

        async def check(upstream: Upstream) -> None:
            url = upstream.url.replace("ws://", "http://", 1).replace("wss://", "https://", 1) + "/health"
            try:
                async with asyncio.timeout(self.connect_timeout_s):
                    async with http.get(url) as response:
                        healthy = response.status == 200
            except (aiohttp.ClientError, TimeoutError, OSError):
                healthy = False
            if not healthy:
                self.mark_down(upstream)
            elif not upstream.healthy:
                upstream.down_until = 0.0  # back: use it again at once

        await asyncio.gather(*(check(u) for u in self.upstreams))

    async def _watch_health(self) -> None:
        while True:
            await self.check_health()
            await asyncio.sleep(self.health_interval_s)

    def candidates(self) -> list[Upstream]:
        """Healthy upstreams by load (fewest open requests first), then the ones marked down, then
        the ones that said they do not serve this endpoint."""
        serving = [u for u in self.upstreams if u.serves]
        healthy = sorted((u for u in serving if u.healthy), key=lambda u: u.active)
        down = sorted((u for u in serving if not u.healthy), key=lambda u: u.down_until)
        return healthy + down + [u for u in self.upstreams if not u.serves]

    def mark_down(self, upstream: Upstream) -> None:
        upstream.failures += 1
        upstream.down_until = time.monotonic() + self.retry_s

    def mark_not_serving(self, upstream: Upstream) -> None:
        upstream.serves = False

    @asynccontextmanager
    async def connect(self) -> AsyncIterator[tuple[Upstream, aiohttp.ClientWebSocketResponse]]:
        """A WebSocket to the best upstream that answers; EngineError when none does."""
        http = self._session()
        failures: list[str] = []
        for upstream in self.candidates():
            try:
                async with asyncio.timeout(self.connect_timeout_s):
                    ws = await http.ws_connect(upstream.url + self.path, max_msg_size=self.max_message_bytes)
            except (aiohttp.ClientError, TimeoutError, OSError) as exc:
                self.mark_down(upstream)
                failures.append(f"{upstream.url}: {exc or type(exc).__name__}")
                continue
            upstream.active += 1
            try:
                yield upstream, ws
            finally:
                upstream.active -= 1
                await ws.close()
            return
        raise EngineError("no upstream reachable (" + "; ".join(failures) + ")")

    async def close(self) -> None:
        if self._health_task is not None:
            self._health_task.cancel()
            await asyncio.gather(self._health_task, return_exceptions=True)
            self._health_task = None
        if self._http is not None:
            await self._http.close()
            self._http = None
