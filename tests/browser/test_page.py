"""The browser client in headless Chromium: what a user sees on the Talk and Generate views.

Chromium's fake camera shows a still blue picture and its fake microphone plays a 660 Hz tone
(conftest.py writes both files); the synthetic engines describe exactly what they receive.
"""

from __future__ import annotations

import asyncio
import re
from pathlib import Path
from typing import Any

import pytest

from ..tools import under_ci
from .conftest import CAMERA_COLOUR, MIC_TONE_HZ, PageFactory

try:
    from playwright.async_api import Page, expect
except ImportError:
    if under_ci():
        raise  # under CI a missing playwright fails the run
    pytest.skip("the playwright package is not installed (pip install -e '.[test]')", allow_module_level=True)

INBOUND_STATS = """async ([view, kind]) => {
  const session = window.rtcOmni[view].session;
  if (!session) return null;
  const totals = {packetsReceived: 0, totalAudioEnergy: 0, framesDecoded: 0};
  (await session.pc.getStats()).forEach((s) => {
    if (s.type === "inbound-rtp" && s.kind === kind) {
      for (const key of Object.keys(totals)) totals[key] += s[key] || 0;
    }
  });
  return totals;
}"""

# The mean colour of the middle of the generated video, read back through a canvas.
VIDEO_COLOUR = """() => {
  const video = document.getElementById("gen-video");
  if (!video.videoWidth) return null;
  const canvas = document.createElement("canvas");
  canvas.width = video.videoWidth;
  canvas.height = video.videoHeight;
  const context = canvas.getContext("2d");
  context.drawImage(video, 0, 0);
  const {data} = context.getImageData(canvas.width / 4, canvas.height / 4, canvas.width / 2, canvas.height / 2);
  const sum = [0, 0, 0];
  for (let i = 0; i < data.length; i += 4) for (let c = 0; c < 3; c++) sum[c] += data[i + c];
  return sum.map((v) => v / (data.length / 4));
}"""


async def connect_talk(page: Page) -> None:
    await page.get_by_role("button", name="Connect", exact=True).click()
    await expect(page.locator("#hud-state")).to_have_text("connected", timeout=20_000)
    await expect(page.locator("#talk-settings-state")).to_have_text("Applied.", timeout=10_000)
    # The server needs one sampled camera frame before it can answer.
    await page.wait_for_function(
        "() => Number(document.getElementById('hud-buffered').textContent) >= 1", timeout=15_000
    )


async def ask(page: Page, text: str) -> None:
    await page.get_by_label("Question", exact=True).fill(text)
    await page.get_by_label("Question", exact=True).press("Enter")


def turn(page: Page, index: int) -> Any:
    return page.locator("#transcript .turn").nth(index)


async def screenshot(page: Page, folder: Path, name: str) -> Path:
    path = folder / name
    await page.screenshot(path=str(path), full_page=True)
    print(f"screenshot: {path}")
    return path


async def test_talk_answer_names_the_camera_colour_and_the_talker_is_heard(
    make_server: Any, open_page: PageFactory, artifacts: Path
) -> None:
    server = await make_server()
    page = await open_page(server.url)
    await connect_talk(page)
    await ask(page, "What colour do you see?")

    first = turn(page, 0)
    await expect(first.locator(".asked")).to_have_text("What colour do you see?")
    await expect(first.locator(".answer")).to_contain_text(f"mostly {CAMERA_COLOUR[0]}", timeout=20_000)
    await expect(first.locator(".answer")).to_contain_text('You asked: "What colour do you see?"')
    # The turn ends when the talker finished speaking it on the RTP track.
    await expect(first).to_have_attribute("data-state", "done", timeout=45_000)

    talker = await page.evaluate(INBOUND_STATS, ["talk", "audio"])
    assert talker["packetsReceived"] > 0, talker
    assert talker["totalAudioEnergy"] > 0, "the talker track carried only silence"
    # The HUD filled in: round trip, per-turn timings, talker packets.
    await expect(page.locator("#hud-rtt")).to_have_text(re.compile(r"^\d+ ms$"))
    await expect(page.locator("#hud-first-text")).to_have_text(re.compile(r"^\d+\.\d\d s$"))
    await expect(page.locator("#hud-first-audio")).to_have_text(re.compile(r"^\d+\.\d\d s$"))
    await expect(page.locator("#hud-talker")).not_to_have_text("0")
    await screenshot(page, artifacts, "talk.png")
    await page.set_viewport_size({"width": 390, "height": 844})
    await screenshot(page, artifacts, "talk-phone.png")


async def test_a_new_question_cancels_the_answer_and_interrupt_stops_it(
    make_server: Any, open_page: PageFactory
) -> None:
    server = await make_server()
    page = await open_page(server.url)
    await connect_talk(page)

    await ask(page, "first question")
    await expect(turn(page, 0)).to_have_attribute("data-state", "speaking", timeout=20_000)
    await ask(page, "second question")  # automatic interrupt: the server cancels the first turn
    await expect(turn(page, 0)).to_have_attribute("data-state", "cancelled", timeout=10_000)
    await expect(turn(page, 0).locator(".meta")).to_contain_text("cancelled")
    await expect(turn(page, 1).locator(".answer")).to_contain_text('You asked: "second question"', timeout=20_000)

    await page.get_by_role("button", name="Interrupt", exact=True).click()
    await expect(turn(page, 1)).to_have_attribute("data-state", "interrupted")
    # The server stopped the turn (response.cancel): the talker track falls silent at the page.
    await page.wait_for_timeout(500)
    before = (await page.evaluate(INBOUND_STATS, ["talk", "audio"]))["totalAudioEnergy"]
    await page.wait_for_timeout(1000)
    after = (await page.evaluate(INBOUND_STATS, ["talk", "audio"]))["totalAudioEnergy"]
    assert after - before < 1e-4, "the interrupted talker still speaks"

    await ask(page, "third question")
    await expect(turn(page, 2).locator(".answer")).to_contain_text('You asked: "third question"', timeout=20_000)
    await expect(turn(page, 2)).to_have_attribute("data-state", re.compile("speaking|done"))
    assert not await page.evaluate("document.getElementById('talker').muted"), "the next answer is muted"
    await expect(turn(page, 1)).to_have_attribute("data-state", "interrupted")


async def test_push_to_talk_asks_with_what_the_microphone_heard(make_server: Any, open_page: PageFactory) -> None:
    server = await make_server()
    page = await open_page(server.url)
    await connect_talk(page)
    assert not await page.evaluate("window.rtcOmni.talk.stream.getAudioTracks()[0].enabled"), "mic open before PTT"

    button = page.get_by_role("button", name="Hold to talk", exact=True)
    await button.focus()
    await page.keyboard.down(" ")
    await expect(button).to_have_attribute("aria-pressed", "true")
    await asyncio.sleep(1.5)  # hold the button while the fake microphone plays its tone
    await page.keyboard.up(" ")

    answer = turn(page, 0).locator(".answer")
    await expect(answer).to_contain_text("dominant frequency about", timeout=20_000)
    heard = re.search(
        r"I heard ([\d.]+) seconds of audio, dominant frequency about (\d+) Hz", await answer.inner_text()
    )
    assert heard, await answer.inner_text()
    assert float(heard.group(1)) >= 1.0
    assert abs(float(heard.group(2)) - MIC_TONE_HZ) <= 0.05 * MIC_TONE_HZ, heard.group(0)


async def test_bad_settings_show_the_servers_error(make_server: Any, open_page: PageFactory) -> None:
    server = await make_server()
    page = await open_page(server.url)

    await page.get_by_label("Frames per question", exact=True).fill("500")
    await page.get_by_role("button", name="Connect", exact=True).click()
    notice = page.locator("#talk-notice")
    await expect(notice).to_be_visible(timeout=20_000)
    await expect(notice).to_contain_text("Invalid session config")
    await expect(notice).to_contain_text("num_frames")
    # Fixing the value and applying again works on the same session.
    await page.get_by_label("Frames per question", exact=True).fill("4")
    await page.get_by_role("button", name="Apply settings", exact=True).click()
    await expect(page.locator("#talk-settings-state")).to_have_text("Applied.", timeout=10_000)

    await page.get_by_role("tab", name="Generate").click()
    await page.get_by_label("Size", exact=True).fill("large")
    await page.get_by_role("button", name="Generate", exact=True).click()
    gen_notice = page.locator("#gen-notice")
    await expect(gen_notice).to_be_visible(timeout=20_000)
    await expect(gen_notice).to_contain_text("Invalid session.start")
    await expect(gen_notice).to_contain_text("WIDTHxHEIGHT")
    await expect(page.get_by_role("button", name="Generate", exact=True)).to_be_enabled()


async def test_generate_plays_the_video_and_takes_a_prompt_change(
    make_server: Any, open_page: PageFactory, artifacts: Path
) -> None:
    server = await make_server()
    page = await open_page(server.url)
    # Keyboard: the tab list moves with the arrow keys.
    await page.get_by_role("tab", name="Talk").focus()
    await page.keyboard.press("ArrowRight")
    await expect(page.locator("#view-generate")).to_be_visible()
    await expect(page.get_by_role("tab", name="Generate")).to_be_focused()

    requested = 99  # three chunks of the synthetic engine at 16 fps: about 6 s of video
    await page.get_by_label("Prompt", exact=True).fill("a red balloon over a field")
    await page.get_by_label("Frames", exact=True).fill(str(requested))
    await page.get_by_role("button", name="Generate", exact=True).click()

    await page.wait_for_function("() => document.getElementById('gen-video').videoWidth > 0", timeout=20_000)
    red = await page.evaluate(VIDEO_COLOUR)
    assert red[0] > red[1] + 60 and red[0] > red[2] + 60, f"the video is not red: {red}"
    early = (await page.evaluate(INBOUND_STATS, ["generate", "video"]))["framesDecoded"]

    await page.get_by_label("New prompt", exact=True).fill("a blue sea")
    await page.get_by_role("button", name="Change prompt", exact=True).click()
    await expect(page.locator("#gen-events")).to_contain_text("acknowledged", timeout=10_000)
    await page.wait_for_function(
        f"() => document.getElementById('gen-progress').value >= {requested // 3}", timeout=20_000
    )
    await screenshot(page, artifacts, "generate.png")

    await expect(page.locator("#gen-status")).to_contain_text("Done", timeout=30_000)
    await expect(page.get_by_role("button", name="Generate", exact=True)).to_be_enabled(timeout=10_000)
    decoded = (await page.evaluate(INBOUND_STATS, ["generate", "video"]))["framesDecoded"]
    assert early < decoded, "frames stopped arriving"
    assert decoded >= 0.9 * requested, f"decoded {decoded} of {requested} frames"
    progress = await page.evaluate(
        "[document.getElementById('gen-progress').value, document.getElementById('gen-progress').max]"
    )
    assert progress[1] == requested and progress[0] >= 0.9 * requested, progress
    blue = await page.evaluate(VIDEO_COLOUR)
    assert blue[2] > blue[0] + 60, f"the prompt change did not show: {blue}"
    link = page.get_by_role("link", name=re.compile("Download the recording"))
    await expect(link).to_be_visible(timeout=10_000)
    assert (await link.get_attribute("href") or "").startswith("blob:")
    await screenshot(page, artifacts, "generate-done.png")


async def test_a_refused_camera_says_so(make_server: Any, open_page: PageFactory) -> None:
    server = await make_server()
    page = await open_page(server.url)
    # As if the user clicked "Block" on the permission prompt.
    await page.evaluate(
        """() => { navigator.mediaDevices.getUserMedia = () =>
             Promise.reject(new DOMException("Permission denied", "NotAllowedError")); }"""
    )
    await page.get_by_role("button", name="Connect", exact=True).click()
    notice = page.locator("#talk-notice")
    await expect(notice).to_contain_text("Camera or microphone access was refused", timeout=10_000)
    await expect(page.get_by_role("button", name="Connect", exact=True)).to_be_enabled()
    await expect(page.locator("#hud-state")).to_have_text("not connected")
