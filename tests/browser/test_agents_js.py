"""The OpenAI Agents SDK for JavaScript (@openai/agents-realtime 0.20), unchanged, in Chromium over
WebRTC against rtc-omni: only its call URL and the ephemeral key are ours.

The app (tests/agents/agents-js/: a RealtimeAgent with a get_weather tool in a RealtimeSession with
the OpenAIRealtimeWebRTC transport and the SDK's default session: semantic VAD, input transcription)
is served from an origin of its own, as a real app is, and its backend (the test) mints the key at
POST /v1/realtime/client_secrets with the server token. The page shows the conversation as the SDK
keeps it, and that is what the tests read. A request anywhere but 127.0.0.1 (tracing, telemetry)
fails in the loopback namespace, and open_page fails the test for it. Chromium's fake microphone
says SPOKEN in a loop, muted until a test opens it.
"""

from __future__ import annotations

import json
import re
import wave
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import numpy as np
import pytest
import pytest_asyncio
from aiohttp import web
from aiohttp.test_utils import TestServer
from playwright.async_api import Locator, Page, expect

from rtc_omni.client.media import AUDIO_RATE, speech48
from rtc_omni.engines import whisper

from ..tools import agent_env, require_tool, unavailable
from .conftest import BROWSER_LOOP, CAMERA_COLOUR, PageFactory, write_y4m

SERVER_TOKEN = "server-token"  # the app's backend holds it; the page only ever sees an ephemeral key
SPOKEN = "Please describe the picture on the table."
TURN_TIMEOUT_MS = 20_000
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def fake_media(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """This module's fake microphone: SPOKEN by espeak-ng between silences, so the server VAD ends each turn."""
    require_tool("espeak-ng", "apt-get install espeak-ng")
    folder = tmp_path_factory.mktemp("agents-js-media")
    camera, mic = folder / "camera.y4m", folder / "mic.wav"
    write_y4m(camera, CAMERA_COLOUR[1])
    silence = np.zeros(AUDIO_RATE, dtype=np.float32)
    samples = np.concatenate([silence, speech48(SPOKEN), silence, silence, silence])
    with wave.open(str(mic), "wb") as out:
        out.setnchannels(1)
        out.setsampwidth(2)
        out.setframerate(AUDIO_RATE)
        out.writeframes((samples * 32767).astype("<i2").tobytes())
    return camera, mic


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def agent_site() -> AsyncIterator[str]:
    """The built app (tests/agents/agents-js/build.sh), served from 127.0.0.1 on a port of its own."""
    site = Path(agent_env("agents-js")) / "site"

    async def index(_: web.Request) -> web.FileResponse:
        return web.FileResponse(site / "index.html")

    app = web.Application()
    app.router.add_get("/", index)
    app.router.add_static("/", site)
    server = TestServer(app, host="127.0.0.1", port=0)
    await server.start_server()
    try:
        yield str(server.make_url("")).rstrip("/")
    finally:
        await server.close()


async def mint_key(server_url: str) -> str:
    """What the app's backend does: an ephemeral key for one session, minted with the server token."""
    async with aiohttp.ClientSession() as http:
        async with http.post(
            server_url + "/v1/realtime/client_secrets",
            json={"session": {"type": "realtime"}},
            headers={"Authorization": f"Bearer {SERVER_TOKEN}"},
        ) as response:
            assert response.status == 200, await response.text()
            return str((await response.json())["value"])


async def connected_app(make_server: Any, open_page: PageFactory, agent_site: str) -> Page:
    """The app, connected to a server of its own that lets the app's origin in (--cors-origin)."""
    server = await make_server(auth_token=SERVER_TOKEN, cors_origin=[agent_site])
    page = await open_page(agent_site)
    await page.evaluate(
        "options => window.agentApp.connect(options)",
        {"serverUrl": server.url, "apiKey": await mint_key(server.url)},
    )
    await expect(page.locator("#state")).to_have_text("connected")
    call_id = await page.evaluate("window.agentApp.session.transport.callId")
    assert call_id in server.registry, (call_id, list(server.registry))  # read from the answer's Location
    return page


def said_by(page: Page, role: str, text: str | re.Pattern[str]) -> Locator:
    return page.locator(f"#history li[data-role={role}]").filter(has_text=text)


async def expect_said(page: Page, role: str, text: str | re.Pattern[str]) -> None:
    """Wait for a history entry of `role` holding `text`; on failure, say what the SDK saw."""
    try:
        await expect(said_by(page, role, text).first).to_be_visible(timeout=TURN_TIMEOUT_MS)
    except AssertionError as failure:
        seen = await page.evaluate("({events: window.agentApp.events, errors: window.agentApp.errors})")
        history = await page.locator("#history").inner_text()
        raise AssertionError(f"{failure}\nhistory:\n{history}\nevents: {seen}") from None


@BROWSER_LOOP
async def test_a_text_message_gets_the_agents_answer(make_server: Any, open_page: PageFactory, agent_site: str) -> None:
    page = await connected_app(make_server, open_page, agent_site)
    await page.evaluate("text => window.agentApp.session.sendMessage(text)", "What colour is the sky?")
    await expect_said(page, "user", "What colour is the sky?")
    await expect_said(page, "assistant", 'You asked: "What colour is the sky?"')
    assert await page.evaluate("window.agentApp.errors") == []


@BROWSER_LOOP
async def test_speech_at_the_microphone_is_heard_transcribed_and_answered(
    make_server: Any, open_page: PageFactory, agent_site: str
) -> None:
    if not whisper.available():
        unavailable("the [transcribe] extra is not installed (pip install -e '.[test]' installs it)")
    page = await connected_app(make_server, open_page, agent_site)
    await page.evaluate("window.agentApp.session.mute(false)")
    # The SDK's default session: the server's VAD ends the turn, the recogniser writes the user's words.
    await expect_said(page, "assistant", re.compile(r"I heard [1-9][\d.]* seconds of audio"))
    await expect_said(page, "user", re.compile(r"picture on the table", re.IGNORECASE))
    await page.evaluate("window.agentApp.session.mute(true)")
    assert await page.evaluate("window.agentApp.errors") == []


@BROWSER_LOOP
async def test_the_agents_tool_runs_in_the_page_and_the_answer_gives_its_result(
    make_server: Any, open_page: PageFactory, agent_site: str
) -> None:
    page = await connected_app(make_server, open_page, agent_site)
    # The synthetic engine calls an offered tool that the user names, with the JSON in the message.
    await page.evaluate("text => window.agentApp.session.sendMessage(text)", 'Use get_weather for {"city": "Paris"}')
    await expect_said(page, "function_call", re.compile(r"get_weather\(.*Paris.*\) -> 22C"))
    await expect_said(page, "assistant", "22C")
    assert [
        (json.loads(arguments), result) for arguments, result in await page.evaluate("window.agentApp.toolResults")
    ] == [({"city": "Paris"}, "22C")]
    assert await page.evaluate("window.agentApp.errors") == []


def test_the_docs_example_is_the_agent_tested_here() -> None:
    """docs/frameworks/agents-js.md's JavaScript is tests/agents/agents-js/agent.js, so it runs as written."""
    docs = (ROOT / "docs" / "frameworks" / "agents-js.md").read_text()
    blocks = [block.split("```")[0] for block in docs.split("```js\n")[1:]]
    assert (ROOT / "tests" / "agents" / "agents-js" / "agent.js").read_text() in blocks
