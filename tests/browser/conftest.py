"""Headless Chromium driven by Playwright against an in-process server, inside a loopback-only namespace.

Chromium's ICE agent cannot be restricted to 127.0.0.1 from outside, so these tests run only in a
network namespace whose one interface is `lo` (`.ci/run` makes one). Outside it, or without
Chromium or the `playwright` package, they skip, except under CI (`CI=true`), where they fail.
Playwright launches Debian's `/usr/bin/chromium`; `playwright install` is never needed.

One Chromium serves a whole test module (each test has a browser context of its own): launching
it costs over a second of CPU. Playwright's objects belong to the event loop that made them, so the
browser tests run in their module's loop (`BROWSER_LOOP`), and so do the async fixtures they use.
"""

from __future__ import annotations

import math
import os
import struct
import wave
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio

from ..conftest import ServerFactory, server_factory
from ..https_server import Certificate
from ..tools import require_loopback_namespace, require_tool, unavailable

CHROMIUM = os.environ.get("RTC_OMNI_CHROMIUM", "/usr/bin/chromium")
CHROMIUM_FLAGS = [
    "--allow-loopback-in-peer-connection",
    "--use-fake-device-for-media-stream",
    "--use-fake-ui-for-media-stream",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-dev-shm-usage",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
    "--disable-quic",
    "--autoplay-policy=no-user-gesture-required",
]

# Each browser test module marks its tests with this, so they share the module's Chromium.
BROWSER_LOOP = pytest.mark.asyncio(loop_scope="module")

# What the fake camera shows and the fake microphone plays: the page's answers must name them.
CAMERA_COLOUR = ("blue", (0, 0, 255))
MIC_TONE_HZ = 660.0


def write_y4m(path: Path, rgb: tuple[int, int, int], width: int = 320, height: int = 240, frames: int = 15) -> None:
    """A still 4:2:0 Y4M clip of one colour (BT.601 limited range), for --use-file-for-fake-video-capture."""
    r, g, b = (c / 255 for c in rgb)
    y = round(16 + 65.481 * r + 128.553 * g + 24.966 * b)
    u = round(128 - 37.797 * r - 74.203 * g + 112.0 * b)
    v = round(128 + 112.0 * r - 93.786 * g - 18.214 * b)
    chroma = (width // 2) * (height // 2)
    frame = b"FRAME\n" + bytes([y]) * (width * height) + bytes([u]) * chroma + bytes([v]) * chroma
    with path.open("wb") as out:
        out.write(f"YUV4MPEG2 W{width} H{height} F30:1 Ip A1:1 C420\n".encode())
        for _ in range(frames):
            out.write(frame)


def write_tone_wav(path: Path, hz: float, seconds: float = 2.0, rate: int = 48_000) -> None:
    """A mono PCM16 tone whose length is a whole number of periods, so Chromium's loop is seamless."""
    samples = int(round(seconds * hz)) * rate // int(hz)
    data = b"".join(struct.pack("<h", int(12_000 * math.sin(2 * math.pi * hz * i / rate))) for i in range(samples))
    with wave.open(str(path), "wb") as out:
        out.setnchannels(1)
        out.setsampwidth(2)
        out.setframerate(rate)
        out.writeframes(data)


def chromium_flags(camera: Path, mic: Path) -> list[str]:
    """Chromium's launch flags, with the fake camera and microphone playing these files."""
    return [*CHROMIUM_FLAGS, f"--use-file-for-fake-video-capture={camera}", f"--use-file-for-fake-audio-capture={mic}"]


@pytest.fixture(scope="session")
def fake_media(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    folder = tmp_path_factory.mktemp("fake-media")
    camera, mic = folder / "camera.y4m", folder / "mic.wav"
    write_y4m(camera, CAMERA_COLOUR[1])
    write_tone_wav(mic, MIC_TONE_HZ)
    return camera, mic


@pytest.fixture
def artifacts(request: pytest.FixtureRequest, tmp_path: Path) -> Path:
    """Where screenshots go: $RTC_OMNI_BROWSER_ARTIFACTS/<test name>, else the test's tmp_path."""
    root = os.environ.get("RTC_OMNI_BROWSER_ARTIFACTS")
    folder = Path(root) / request.node.name if root else tmp_path / "artifacts"
    folder.mkdir(parents=True, exist_ok=True)
    return folder


@pytest_asyncio.fixture(loop_scope="module")
async def make_server() -> AsyncIterator[ServerFactory]:
    """tests/conftest.py's `make_server`, in the module's loop (BROWSER_LOOP)."""
    async with server_factory() as factory:
        yield factory


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def browser(fake_media: tuple[Path, Path], certificate: Certificate) -> AsyncIterator[Any]:
    """Chromium, trusting the suite's certificate by its key (as the certificate of an https server)."""
    require_loopback_namespace()  # Chromium's ICE agent cannot be kept on 127.0.0.1 otherwise
    try:
        from playwright.async_api import async_playwright
    except ImportError:
        unavailable("the playwright package is not installed (pip install -e '.[test]')")
    require_tool(CHROMIUM, "apt-get install chromium")
    flags = [*chromium_flags(*fake_media), f"--ignore-certificate-errors-spki-list={certificate.spki_sha256}"]
    async with async_playwright() as playwright:
        launched = await playwright.chromium.launch(executable_path=CHROMIUM, headless=True, args=flags, timeout=30_000)
        try:
            yield launched
        finally:
            await launched.close()


class PageProblems:
    """Console errors, uncaught exceptions and failed requests seen by a page."""

    # Optional endpoints the page probes; a 404 from them is expected on a server without them.
    OPTIONAL = ("/v1/ice-servers",)

    def __init__(self, expected_status: tuple[int, ...] = ()) -> None:
        self.problems: list[str] = []
        self.expected_status = expected_status  # statuses the test provokes on purpose

    def _optional(self, url: str) -> bool:
        return any(url.split("?")[0].endswith(path) for path in self.OPTIONAL)

    def _expected(self, status: int, url: str) -> bool:
        return status in self.expected_status or (status == 404 and self._optional(url))

    def watch(self, page: Any) -> None:
        page.on("console", self._on_console)
        page.on("pageerror", lambda error: self.problems.append(f"uncaught: {error}"))
        page.on("requestfailed", lambda req: self.problems.append(f"request failed: {req.url} {req.failure}"))
        page.on("response", self._on_response)

    def _on_console(self, message: Any) -> None:
        if message.type != "error":
            return
        url = message.location.get("url", "")
        if "Failed to load resource" in message.text and (
            self._optional(url) or any(f"status of {status} " in message.text for status in self.expected_status)
        ):
            return
        self.problems.append(f"console error: {message.text} at {message.location}")

    def _on_response(self, response: Any) -> None:
        if response.status >= 400 and not self._expected(response.status, response.url):
            self.problems.append(f"HTTP {response.status} for {response.request.method} {response.url}")


PageFactory = Callable[..., Awaitable[Any]]


@pytest_asyncio.fixture(loop_scope="module")
async def open_page(browser: Any) -> AsyncIterator[PageFactory]:
    """Open the client page of a server; at the end, assert the page had no console errors or failed requests."""
    contexts: list[Any] = []
    watchers: list[PageProblems] = []

    async def factory(url: str, width: int = 1280, height: int = 860, expected_status: tuple[int, ...] = ()) -> Any:
        context = await browser.new_context(viewport={"width": width, "height": height})
        contexts.append(context)
        page = await context.new_page()
        watcher = PageProblems(expected_status)
        watcher.watch(page)
        watchers.append(watcher)
        page.set_default_timeout(15_000)
        await page.goto(url + "/")
        return page

    yield factory
    problems = [p for w in watchers for p in w.problems]  # before closing: closing aborts polls
    for context in contexts:
        await context.close()
    assert not problems, "the page reported problems:\n" + "\n".join(problems)
