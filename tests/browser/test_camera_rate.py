"""The page's camera sends what the server samples: maxFramerate follows `sample_fps`, maxBitrate
follows maxFramerate, and the server's answer caps the bitrate a browser sends (b=AS, REMB).

Chromium's fake camera captures at 30 fps (conftest.py's Y4M file).
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from ..tools import under_ci
from .conftest import BROWSER_LOOP, PageFactory

try:
    from playwright.async_api import Page, expect
except ImportError:
    if under_ci():
        raise
    pytest.skip("the playwright package is not installed (pip install -e '.[test]')", allow_module_level=True)

from .talk_view import connect_talk  # after the guard: it needs playwright

pytestmark = BROWSER_LOOP

CAPTURE_FPS = 30
WINDOW_S = 3.0

CAMERA_SENDER = """() => {
  const sender = window.rtcOmni.talk.cameraSender;
  return sender ? sender.getParameters().encodings[0].maxFramerate ?? null : null;
}"""
CAMERA_MAX_BITRATE = """() => window.rtcOmni.talk.cameraSender.getParameters().encodings[0].maxBitrate ?? null"""
BITS_PER_FRAME = 30_000  # static/js/talk.js CAMERA_BITS_PER_FRAME

OUTBOUND_VIDEO = """async () => {
  let found = null;
  (await window.rtcOmni.talk.session.pc.getStats()).forEach((s) => {
    if (s.type === "outbound-rtp" && s.kind === "video") {
      found = {targetBitrate: s.targetBitrate, framesSent: s.framesSent};
    }
  });
  return found;
}"""


async def frames_received_in_window(server: Any, page: Page) -> int:
    """Camera frames the server received from the page's session over WINDOW_S seconds."""
    session_id = await page.evaluate("window.rtcOmni.talk.session.sessionId")
    session = server.registry.get(session_id).session
    before = session.stats()["frames_received"]
    await asyncio.sleep(WINDOW_S)
    return session.stats()["frames_received"] - before


async def highest_target_bitrate(page: Page, seconds: float) -> int:
    """The highest bitrate Chromium's camera encoder aimed at over the next `seconds`.

    Chromium's encoder starts under its ceiling (measured: 250 kb/s under the server's 300 kb/s
    b=AS alone, 125 kb/s under the page's 150 kb/s maxBitrate), then follows aiortc's REMB, which
    starts lower and climbs over ~10 s; so the first seconds after connecting show the page's cap.
    """
    highest = 0
    for _ in range(int(seconds / 0.25)):
        outbound = await page.evaluate(OUTBOUND_VIDEO)
        highest = max(highest, (outbound or {}).get("targetBitrate") or 0)  # none before the first frame
        await asyncio.sleep(0.25)
    return highest


def at_most(fps: float) -> int:
    """Frames a sender at `fps` can deliver in the window, with room for a late burst: far below 30 fps."""
    return int(fps * WINDOW_S * 1.5) + 3


async def test_the_camera_sends_what_the_default_sampling_rate_needs(make_server: Any, open_page: PageFactory) -> None:
    server = await make_server()
    page = await open_page(server.url)
    await connect_talk(page)
    # Under the server's 300 kb/s cap, the page asks its encoder for half of it at 5 fps.
    assert 0 < await highest_target_bitrate(page, 2.0) <= 5 * BITS_PER_FRAME
    assert await page.evaluate(CAMERA_MAX_BITRATE) == 5 * BITS_PER_FRAME

    assert await page.evaluate(CAMERA_SENDER) == 5  # max(2 x 2 fps, 5)
    await expect(page.locator("#hud-camera")).to_have_text("≤ 5 fps")
    received = await frames_received_in_window(server, page)
    assert 0 < received <= at_most(5) < CAPTURE_FPS * WINDOW_S, received


async def test_the_camera_rate_follows_the_sample_fps_the_session_applies(
    make_server: Any, open_page: PageFactory
) -> None:
    server = await make_server()
    page = await open_page(server.url)
    await page.get_by_label("Camera sample rate (fps)", exact=True).fill("100")  # out of range: rejected
    await page.get_by_role("button", name="Connect", exact=True).click()
    await expect(page.locator("#talk-notice")).to_contain_text("sample_fps", timeout=20_000)
    assert await page.evaluate(CAMERA_SENDER) == CAPTURE_FPS  # 200 wanted, capped at the capture rate

    await page.get_by_label("Camera sample rate (fps)", exact=True).fill("4")
    await page.get_by_role("button", name="Apply settings", exact=True).click()
    await expect(page.locator("#talk-settings-state")).to_have_text("Applied.", timeout=10_000)
    await expect(page.locator("#hud-camera")).to_have_text("≤ 8 fps")
    assert await page.evaluate(CAMERA_SENDER) == 8
    assert await page.evaluate(CAMERA_MAX_BITRATE) == 8 * BITS_PER_FRAME
    received = await frames_received_in_window(server, page)
    assert 0 < received <= at_most(8), received


async def test_the_answer_caps_the_browsers_video_bitrate(make_server: Any, open_page: PageFactory) -> None:
    server = await make_server(max_video_bitrate=100)
    page = await open_page(server.url)
    await connect_talk(page)
    await asyncio.sleep(2.0)  # past Chromium's 300 kb/s start bitrate, had nothing capped it
    outbound = await page.evaluate(OUTBOUND_VIDEO)
    assert outbound is not None and outbound["framesSent"] > 0, outbound
    assert 0 < outbound["targetBitrate"] <= 100_000, outbound
