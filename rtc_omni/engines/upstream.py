"""The upstream servers a remote engine forwards to: choice by load, health checks, failover.

Each generation, and each understanding session, holds its own WebSocket to one endpoint path of
one upstream.
The pool picks the healthy upstream with the fewest open sockets; an upstream that refused a
connection or dropped one mid-request is skipped for `retry_s`, then tried again. Besides these
passive checks, the pool polls each upstream's HTTP health endpoint (`/health`, which vLLM's and
vLLM-Omni's servers and ours answer) every `health_interval_s`, so a dead upstream is skipped
before a session lands on it and a recovered one comes back without waiting for `retry_s`. When every
upstream is marked down, they are all tried anyway (soonest back first), so a fleet that recovers
is used again without a restart. A server that answers that it does not serve the endpoint (one
model per vLLM-Omni server; no duplex session for `/v1/realtime`) is tried last for five minutes,
then asked again, so understanding and generation servers can share one `--upstream` list.
Upstream addresses stay in logs and metrics: messages that reach clients never name them.
"""

from __future__ import annotations

import asyncio
import base64
import logging
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass

import aiohttp

from .engine import EngineError

logger = logging.getLogger(__name__)

DEFAULT_MAX_MESSAGE_BYTES = 64 * 1024 * 1024  # the largest kind: one generated fMP4 chunk
NOT_SERVING_RECHECK_S = 300.0
MAX_ANSWER_CHARS = 1024 * 1024  # one answer's text over all its deltas (a model's answer is a few KB)


def check_answer_length(chars: int) -> None:
    """EngineError once an upstream's answer passes MAX_ANSWER_CHARS: a broken one costs no more."""
    if chars > MAX_ANSWER_CHARS:
        raise EngineError(f"the upstream answered over {MAX_ANSWER_CHARS} characters")


def b64text(data: bytes) -> str:
    """Bytes as the base64 text a JSON event carries."""
    return base64.b64encode(data).decode("ascii")


@dataclass
class Upstream:
    url: str  # ws://HOST:PORT
    active: int = 0
    failures: int = 0
    down_until: float = 0.0
    not_serving_until: float = 0.0  # after it answered that it does not serve this endpoint

    @property
    def healthy(self) -> bool:
        return time.monotonic() >= self.down_until

    @property
    def serves(self) -> bool:
        """As far as is known: one that said it does not is asked again after NOT_SERVING_RECHECK_S
        (a fleet's servers are redeployed with other models)."""
        return time.monotonic() >= self.not_serving_until


@dataclass
class UpstreamSocket:
    """One session's WebSocket to an upstream, and the task reading it."""

    upstream: Upstream
    ws: aiohttp.ClientWebSocketResponse
    reader: asyncio.Task[None] | None = None
    closing: bool = False  # we closed it: not the upstream's fault


def _failure(exc: BaseException, presented_key: bool) -> str:
    """Why a WebSocket to an upstream failed, for the log: a refused token names the setting."""
    if isinstance(exc, aiohttp.WSServerHandshakeError) and exc.status in (401, 403):
        return f"HTTP {exc.status}: it refused {'the' if presented_key else 'a request without'} --upstream-api-key"
    return str(exc) or type(exc).__name__


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
        api_key: str | None = None,
    ) -> None:
        """`max_message_bytes`: the largest message an upstream of this endpoint may send; aiohttp
        fails the connection at that size before buffering more. `api_key`: sent as a Bearer token
        with every request to the upstreams (their WebSockets and health checks)."""
        if not urls:
            raise ValueError("the remote engine needs at least one --upstream ws://HOST:PORT")
        self.upstreams = [Upstream(url) for url in urls]
        self.path = path
        self.retry_s = retry_s
        self.connect_timeout_s = connect_timeout_s
        self.health_interval_s = health_interval_s
        self.max_message_bytes = max_message_bytes
        self._headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._http: aiohttp.ClientSession | None = None
        self._health_task: asyncio.Task[None] | None = None

    def _session(self) -> aiohttp.ClientSession:
        if self._http is None:
            self._http = aiohttp.ClientSession(headers=self._headers)
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
        upstream.not_serving_until = time.monotonic() + NOT_SERVING_RECHECK_S

    async def open(
        self, query: str = "", only: Upstream | None = None
    ) -> tuple[Upstream, aiohttp.ClientWebSocketResponse]:
        """A WebSocket to the best upstream that answers (or to `only`), at the pool's path plus
        `query`, counted as open until `release`; EngineError when none does (the addresses go to the
        log, not to the client)."""
        http = self._session()
        failures: list[str] = []
        for upstream in [only] if only is not None else self.candidates():
            try:
                async with asyncio.timeout(self.connect_timeout_s):
                    url = upstream.url + self.path + query
                    ws = await http.ws_connect(url, max_msg_size=self.max_message_bytes)
            except (aiohttp.ClientError, TimeoutError, OSError) as exc:
                if isinstance(exc, aiohttp.WSServerHandshakeError) and exc.status == 404:
                    self.mark_not_serving(upstream)  # up, without this endpoint
                else:
                    self.mark_down(upstream)
                failures.append(f"{upstream.url}: {_failure(exc, bool(self._headers))}")
                continue
            upstream.active += 1
            return upstream, ws
        logger.warning("no upstream reachable for %s (%s)", self.path, "; ".join(failures))
        raise EngineError(f"no upstream reachable ({len(failures)} tried)")

    async def release(self, upstream: Upstream, ws: aiohttp.ClientWebSocketResponse) -> None:
        upstream.active -= 1
        await ws.close()

    @asynccontextmanager
    async def connect(self) -> AsyncIterator[tuple[Upstream, aiohttp.ClientWebSocketResponse]]:
        """`open` for the length of one request."""
        upstream, ws = await self.open()
        try:
            yield upstream, ws
        finally:
            await self.release(upstream, ws)

    async def close(self) -> None:
        if self._health_task is not None:
            self._health_task.cancel()
            await asyncio.gather(self._health_task, return_exceptions=True)
            self._health_task = None
        if self._http is not None:
            await self._http.close()
            self._http = None
