"""Shared fixtures: an in-process server on 127.0.0.1 and headless aiortc peers restricted to loopback.

Tests that stream real-time media (real peers, a browser, coturn, FFmpeg or the CLI in a subprocess)
are marked `media`; `python -m pytest -m "not media"` is the fast tier. A test that uses one of
MEDIA_FIXTURES is marked here; others say so with `pytest.mark.media`.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import numpy as np
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from rtc_omni import patches
from rtc_omni.app import create_app
from rtc_omni.client.media import COLOURS, ColourVideoTrack, ToneAudioTrack
from rtc_omni.client.rtc_peers import UnderstandClient
from rtc_omni.config import Settings
from rtc_omni.engines import Engines, SyntheticEngine, SyntheticVideoEngine, create_engines, smart_turn
from rtc_omni.engines.synthetic import tone_voice
from rtc_omni.event_loop import loop_factory
from rtc_omni.signaling.keys import ENGINES, REGISTRY

from .https_server import Certificate, self_signed
from .tools import require_tool, unavailable
from .wsclient import WsClient

patches.apply()  # every peer of the suite gathers on 127.0.0.1 only, as the servers do

# OpenMP threads (torch's, in the vLLM-Omni servers of the real-vLLM tier) sleep when idle instead
# of spinning: the suite's processes share two cores with tests that play media in real time. The
# tier alone (tests/test_vllm_*.py, test_bridge_genuine.py), two runs each: 265 and 257 s, 390 and
# 396 user CPU-s with libgomp's default; 232 and 231 s, 317 and 334 CPU-s passive.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")


def pytest_asyncio_loop_factories(config: pytest.Config, item: pytest.Item) -> dict[str, Callable[[], Any]]:
    """Every test runs on the loop `rtc-omni serve` runs by default (--event-loop auto: uvloop)."""
    factory = loop_factory("auto")
    return {"uvloop" if factory is not None else "asyncio": factory or asyncio.new_event_loop}


FAST_SETTINGS = dict(
    host="127.0.0.1",
    ice_address=["127.0.0.1"],
    synthetic_ttft=0.05,
    synthetic_token_rate=200.0,
    synthetic_audio_speed=8.0,
    synthetic_voice="tone",
    session_rate_limit=0,  # tests open many sessions from one address; test_reliability checks the limit
)


MEDIA_FIXTURES = {"make_client", "coturn", "browser", "served", "shared_server"}


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if MEDIA_FIXTURES.intersection(getattr(item, "fixturenames", ())) or item.get_closest_marker("slow"):
            item.add_marker(pytest.mark.media)
    # The suite runs on pytest-xdist workers a file at a time (pyproject's addopts): files with a slow
    # test start first, then media, then the quick rest, so the long files do not finish last.
    rank: dict[Any, int] = {}
    for item in items:
        own = 0 if item.get_closest_marker("slow") else 1 if item.get_closest_marker("media") else 2
        rank[item.path] = min(rank.get(item.path, own), own)
    items.sort(key=lambda item: rank[item.path])


@pytest.fixture(scope="session")
def certificate(tmp_path_factory: pytest.TempPathFactory) -> Certificate:
    """The suite's self-signed certificate for 127.0.0.1 (and its key), for the https servers."""
    return self_signed(tmp_path_factory.mktemp("tls"))


@pytest.fixture
def espeak_ng() -> str:
    """espeak-ng, for tests that speak real sentences; without it they skip (fail under CI)."""
    return require_tool("espeak-ng", "apt-get install espeak-ng")


@pytest.fixture
def end_of_turn_model() -> None:
    """The end-of-turn model of the [turn] extra; without it, tests skip (fail under CI)."""
    reason = smart_turn.unavailable()
    if reason is not None:
        unavailable(f"{reason} (pip install -e '.[test]' installs it)")


class ShortSpeechEngine(SyntheticEngine):
    """The synthetic engine, whose talker speaks only the first sentences of the answer (one sentence is
    ~1.3 s of tone voice, the whole answer ~10 s, played in real time): the same talker path, for tests
    about speech that need not hear all of it. The text is the whole answer."""

    def __init__(self, settings: Settings, sentences: int) -> None:
        super().__init__(settings.synthetic_ttft, settings.synthetic_token_rate, settings.synthetic_audio_speed, "tone")
        self.sentences = sentences

    def _speak(self, text: str) -> np.ndarray:
        return tone_voice(". ".join(text.split(". ")[: self.sentences]))


class RunningServer:
    def __init__(self, server: TestServer) -> None:
        self.server = server
        self.app: web.Application = server.app

    @property
    def url(self) -> str:
        return str(self.server.make_url("")).rstrip("/")

    @property
    def registry(self) -> Any:
        return self.app[REGISTRY]

    @property
    def engine(self) -> SyntheticEngine:
        return self.app[ENGINES].understand  # type: ignore[return-value]

    @property
    def video_engine(self) -> SyntheticVideoEngine:
        return self.app[ENGINES].generate  # type: ignore[return-value]


ServerFactory = Callable[..., Awaitable[RunningServer]]


@contextlib.asynccontextmanager
async def server_factory() -> AsyncIterator[ServerFactory]:
    """Make servers (see `factory`) until the block ends, then close them; `make_server` as a block."""
    servers: list[TestServer] = []

    async def factory(
        engine: Any = None,
        video_engine: Any = None,
        spoken_sentences: int | None = None,
        settings: Settings | None = None,
        **overrides: Any,
    ) -> RunningServer:
        """A server with FAST_SETTINGS plus overrides, or `settings` whole (a remote gateway's: its
        engines are the ones they name); `engine` / `video_engine` replace the synthetic ones;
        `spoken_sentences` makes the understanding engine a ShortSpeechEngine."""
        settings = settings or Settings(**{**FAST_SETTINGS, **overrides})
        engines = await create_engines(settings)
        if spoken_sentences is not None:
            engine = ShortSpeechEngine(settings, spoken_sentences)
        engines = Engines(understand=engine or engines.understand, generate=video_engine or engines.generate)
        server = TestServer(create_app(settings, engines=engines), host="127.0.0.1", port=0)
        await server.start_server()
        servers.append(server)
        return RunningServer(server)

    try:
        yield factory
    finally:
        for server in servers:
            await server.close()


@pytest.fixture
async def make_server() -> AsyncIterator[ServerFactory]:
    async with server_factory() as factory:
        yield factory


@pytest.fixture
async def server(make_server: ServerFactory) -> RunningServer:
    return await make_server()


ClientFactory = Callable[..., Awaitable[UnderstandClient]]


@pytest.fixture
async def make_client() -> AsyncIterator[ClientFactory]:
    clients: list[UnderstandClient] = []

    async def factory(
        server: RunningServer,
        colour: str | None = "red",
        tone: float | None = 440.0,
        moving: bool = False,
        config: dict[str, Any] | None = None,
        **kwargs: Any,
    ) -> UnderstandClient:
        video = ColourVideoTrack(COLOURS[colour], 320, 240, 30, moving=moving) if colour else None
        audio = ToneAudioTrack(tone) if tone is not None else None
        client = UnderstandClient(server.url, video=video, audio=audio, **kwargs)
        clients.append(client)
        await client.connect()
        if config is not None:
            await client.configure(**config)
        return client

    yield factory
    for client in clients:
        await client.close()


async def http_json(server: RunningServer, method: str, path: str, **kwargs: Any) -> tuple[int, Any]:
    """One HTTP request to the server; returns the status and the JSON body (None if not JSON)."""
    import aiohttp

    async with aiohttp.ClientSession() as http:
        async with http.request(method, server.url + path, **kwargs) as response:
            try:
                body = await response.json(content_type=None)
            except ValueError:
                body = None
            return response.status, body


WsFactory = Callable[..., Awaitable[WsClient]]


@pytest.fixture
async def make_ws() -> AsyncIterator[WsFactory]:
    """Plain WebSocket clients of a server's vLLM-Omni endpoints, closed at the end of the test."""
    clients: list[WsClient] = []

    async def factory(server: RunningServer, path: str) -> WsClient:
        client = await WsClient.connect(server.url.replace("http://", "ws://") + path)
        clients.append(client)
        return client

    yield factory
    for client in clients:
        await client.close()
