"""The browser client in headless Chromium: what a user sees on the Talk and Generate views.

Chromium's fake camera shows a still blue picture and its fake microphone plays a 660 Hz tone
(conftest.py writes both files); the synthetic engines describe exactly what they receive. A
network change is made by dropping the old path's UDP port with nftables (tests/lossy.py).
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from ..https_server import Certificate, rtc_omni_serve
from ..lossy import udp_port_cut
from ..tools import under_ci
from .conftest import BROWSER_LOOP, CAMERA_COLOUR, MIC_TONE_HZ, PageFactory

try:
    from playwright.async_api import Page, expect
except ImportError:
    if under_ci():
        raise  # under CI a missing playwright fails the run
    pytest.skip("the playwright package is not installed (pip install -e '.[test]')", allow_module_level=True)

from .talk_view import connect_talk  # after the guard: it needs playwright

pytestmark = BROWSER_LOOP

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

# Whether the talker is silent at the page. Chromium's audioLevel is the peak of the last ~100 ms of
# playout, divided by 4 every ~100 ms after the sound stops, so it reads 0 about 0.8 s after the
# last sound; and the sound ends some 0.3-0.5 s after the server's last packet (Chromium's jitter
# buffer and audio output). So silence shows about 1.3 s after the server stopped, more under load.
TALKER_LEVEL = """async () => {
  let level = null;
  (await window.rtcOmni.talk.session.pc.getStats()).forEach((s) => {
    if (s.type === "inbound-rtp" && s.kind === "audio") level = s.audioLevel;
  });
  return level;
}"""


async def wait_for_talker_silence(page: Page, timeout_s: float) -> None:
    """Return once the page's talker level reads 0; fail after `timeout_s`."""
    try:
        async with asyncio.timeout(timeout_s):
            while await page.evaluate(TALKER_LEVEL) != 0:
                await asyncio.sleep(0.1)
    except TimeoutError:
        pytest.fail(f"the talker still speaks at the page after {timeout_s} s")


LONG_QUESTION = "second question: " + " ".join(["describe everything you see and hear in detail"] * 6)

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


async def ask(page: Page, text: str) -> None:
    await page.get_by_label("Question", exact=True).fill(text)
    await page.get_by_label("Question", exact=True).press("Enter")


def turn(page: Page, index: int) -> Any:
    return page.locator("#transcript .turn").nth(index)


PHONE_WIDTH = 390

# The page and the two scrolling boxes fit their width: nothing scrolls sideways.
SIDEWAYS_OVERFLOW = """() => ({
  page: document.documentElement.scrollWidth,
  boxes: [...document.querySelectorAll(".transcript, .events")].map((box) => box.scrollWidth - box.clientWidth),
})"""


async def assert_fits_phone_width(page: Page) -> None:
    widths = await page.evaluate(SIDEWAYS_OVERFLOW)
    assert widths["page"] <= PHONE_WIDTH and all(extra <= 0 for extra in widths["boxes"]), widths


async def assert_in_view_unscrolled(page: Page, *targets: Any) -> None:
    """Each target lies wholly inside the viewport with the page at its top: seen without scrolling."""
    await page.evaluate("window.scrollTo(0, 0)")  # Playwright's clicks and fills scroll to their target
    viewport = page.viewport_size
    for target in targets:
        box = await target.bounding_box()
        assert box is not None, f"{target} is not shown"
        inside = box["x"] >= 0 and box["y"] >= 0 and box["x"] + box["width"] <= viewport["width"]
        assert inside and box["y"] + box["height"] <= viewport["height"], f"{target} at {box}, viewport {viewport}"


def button(page: Page, name: str) -> Any:
    return page.get_by_role("button", name=name, exact=True)


async def wait_for_level(page: Page, meter_id: str, above: int, timeout: float = 15_000) -> None:
    """Wait until a level meter (role="meter", 0-100) shows more than `above`."""
    await page.wait_for_function(
        "([id, above]) => Number(document.getElementById(id).getAttribute('aria-valuenow')) > above",
        arg=[meter_id, above],
        timeout=timeout,
    )


async def screenshot(page: Page, folder: Path, name: str) -> Path:
    path = folder / name
    await page.screenshot(path=str(path), full_page=True)
    print(f"screenshot: {path}")
    return path


@pytest.fixture
def https_server(certificate: Certificate, tmp_path: Path) -> Iterator[str]:
    """`rtc-omni serve --tls-cert/--tls-key`, its https URL (a test asks for it before its page, so
    that the page is closed before the server stops)."""
    tls = ["--tls-cert", str(certificate.cert), "--tls-key", str(certificate.key), "--synthetic-token-rate", "200"]
    with rtc_omni_serve(*tls, log=tmp_path / "server.log") as (url, _warnings):
        yield url


async def test_the_page_over_https_connects_and_answers(https_server: str, open_page: PageFactory) -> None:
    assert https_server.startswith("https://127.0.0.1:")
    page = await open_page(https_server)
    assert await page.evaluate("window.isSecureContext && location.protocol") == "https:"
    await connect_talk(page)  # /v1/ice-servers and the offer over https, then ICE, DTLS and the channel
    await ask(page, "What colour do you see?")
    await expect(turn(page, 0).locator(".answer")).to_contain_text(f"mostly {CAMERA_COLOUR[0]}", timeout=20_000)


async def test_talk_answer_names_the_camera_colour_and_the_talker_is_heard(
    make_server: Any, open_page: PageFactory, artifacts: Path
) -> None:
    server = await make_server(spoken_sentences=2)  # ~4 s of the answer spoken; the text is all of it
    page = await open_page(server.url)
    frames_setting = page.get_by_label("Frames per question", exact=True)
    await expect(frames_setting).to_have_value("4")
    await expect(frames_setting).to_have_accessible_description(re.compile("a still camera gives 1"))
    await connect_talk(page)
    # The still camera's next sampled frame is filtered (EVS) as like the first one.
    await page.wait_for_function("() => Number(document.getElementById('hud-filtered').textContent) >= 1")
    await ask(page, "What colour do you see?")

    first = turn(page, 0)
    await expect(first.locator(".asked")).to_have_text("What colour do you see?")
    await expect(first.locator(".answer")).to_contain_text(f"mostly {CAMERA_COLOUR[0]}", timeout=20_000)
    await expect(first.locator(".answer")).to_contain_text('You asked: "What colour do you see?"')
    # The answer saw fewer frames than the setting asks for, and the turn says why.
    seen = re.search(r"I see (\d+) frames? of", await first.locator(".answer").inner_text())
    assert seen and int(seen.group(1)) < 4, await first.locator(".answer").inner_text()
    await expect(first.locator(".meta")).to_contain_text(
        f"{seen.group(1)} of 4 frames: similar frames are skipped (a still camera gives 1)"
    )
    await assert_in_view_unscrolled(page, page.locator("#transcript"), page.get_by_label("Question", exact=True))
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
    # A long question makes a long answer: its first sentence alone speaks for about 15 s.
    await ask(page, LONG_QUESTION)  # automatic interrupt: the server cancels the first turn
    await expect(turn(page, 0)).to_have_attribute("data-state", "cancelled", timeout=10_000)
    await expect(turn(page, 0).locator(".meta")).to_contain_text("cancelled")
    await expect(turn(page, 1).locator(".answer")).to_contain_text('You asked: "second question', timeout=20_000)
    await expect(turn(page, 1)).to_have_attribute("data-state", "speaking", timeout=20_000)
    await page.wait_for_timeout(1000)  # the engine, 8x faster than real time, queues ~8 s of speech meanwhile

    await page.get_by_role("button", name="Interrupt", exact=True).click()
    await expect(turn(page, 1)).to_have_attribute("data-state", "interrupted")
    # The server stopped the turn and dropped its queued speech: the talker falls silent at the page
    # well before those ~8 s have played (it takes ~1.3 s here: see TALKER_LEVEL), and stays silent.
    await wait_for_talker_silence(page, timeout_s=5.0)
    before = (await page.evaluate(INBOUND_STATS, ["talk", "audio"]))["totalAudioEnergy"]
    await page.wait_for_timeout(1000)
    after = (await page.evaluate(INBOUND_STATS, ["talk", "audio"]))["totalAudioEnergy"]
    assert after - before < 1e-4, "the interrupted talker speaks again"

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


async def test_the_empty_transcript_says_what_to_do_next(make_server: Any, open_page: PageFactory) -> None:
    server = await make_server()
    page = await open_page(server.url)
    hint = page.locator("#transcript .empty")
    await expect(hint).to_have_text(re.compile("^Connect, then"))
    await connect_talk(page)
    await expect(hint).to_have_text("Type a question below, or hold “Hold to talk” and speak: the answer appears here.")
    await button(page, "Disconnect").click()
    await expect(hint).to_have_text(re.compile("^Connect, then"))


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
    await assert_in_view_unscrolled(page, page.get_by_label("Generated video"))
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


async def test_the_page_connects_when_the_channel_opens_before_the_answer_is_applied(
    make_server: Any, open_page: PageFactory
) -> None:
    """A CI run beside vLLM's tests saw the control channel open before setRemoteDescription's
    promise resumed the page, which then waited for an "open" event that had already fired."""
    server = await make_server()
    page = await open_page(server.url)
    await page.evaluate(
        """() => {
          const apply = RTCPeerConnection.prototype.setRemoteDescription;
          RTCPeerConnection.prototype.setRemoteDescription = async function (description) {
            await apply.call(this, description);
            // resume the caller only once the channel is open, as the loaded machine did
            for (let waited = 0; waited < 5000 && this.sctp?.state !== "connected"; waited += 50) {
              await new Promise((resolve) => setTimeout(resolve, 50));
            }
            await new Promise((resolve) => setTimeout(resolve, 500));
          };
        }"""
    )
    await connect_talk(page)


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


async def test_state_and_meters_follow_the_microphone_and_the_talker_at_phone_width(
    make_server: Any, open_page: PageFactory, artifacts: Path
) -> None:
    server = await make_server(spoken_sentences=3)  # ~5 s of speech: the checks while it speaks take ~1 s
    page = await open_page(server.url, width=PHONE_WIDTH, height=844)
    state = page.locator("#talk-state")
    await expect(state).to_have_attribute("data-state", "off")
    for name in ("Disconnect", "Ask", "Hold to talk", "Interrupt"):
        await expect(button(page, name)).to_be_disabled()

    await connect_talk(page)
    await expect(button(page, "Connect")).to_be_disabled()
    await expect(state).to_have_attribute("data-state", "listening")
    await expect(page.locator("#talk-state-text")).to_contain_text("hold")
    # The fake microphone's tone moves the mic meter, and the page says push-to-talk keeps it from the server.
    await wait_for_level(page, "mic-level", 20)
    await expect(page.locator("#mic-state")).to_have_text("muted: hold to talk")
    await expect(page.locator("#ptt-hint")).to_contain_text("only while you hold the button")
    await expect(button(page, "Ask")).to_be_disabled()  # no question typed
    await expect(button(page, "Interrupt")).to_be_disabled()  # nothing to interrupt

    await ask(page, "What colour do you see? " + "x" * 150)  # one long word must wrap, not widen the page
    await expect(state).to_have_attribute("data-state", "speaking", timeout=20_000)
    await wait_for_level(page, "talker-level", 20, timeout=5_000)
    await expect(turn(page, 0)).to_have_attribute("data-state", "speaking")
    await expect(turn(page, 0).locator(".meta")).to_contain_text("mic muted (push to talk)")
    await expect(button(page, "Interrupt")).to_be_enabled()
    await assert_fits_phone_width(page)
    # At 390x844 the answer, the state, and what to press next are all in view, with the camera above.
    in_view = [state, page.locator("#transcript"), page.get_by_label("Question", exact=True)]
    in_view += [button(page, "Hold to talk"), button(page, "Interrupt"), page.get_by_label("Your camera")]
    await assert_in_view_unscrolled(page, *in_view)
    await screenshot(page, artifacts, "talk-phone-speaking.png")

    # The talker finished: the turn is done, the page listens again and nothing is left to interrupt.
    await expect(turn(page, 0)).to_have_attribute("data-state", "done", timeout=45_000)
    await expect(state).to_have_attribute("data-state", "listening", timeout=5_000)
    await expect(page.locator("#talker-state")).to_have_text("silent")
    await expect(button(page, "Interrupt")).to_be_disabled()
    await page.get_by_label("Open mic").check()
    await expect(page.locator("#mic-state")).to_have_text("sending")
    await expect(page.locator("#talk-state-text")).to_have_text("Listening (open mic)")
    await expect(page.locator("#ptt-hint")).to_contain_text("Open mic")


async def test_change_prompt_works_only_while_the_engine_generates(
    make_server: Any, open_page: PageFactory, artifacts: Path
) -> None:
    server = await make_server(synthetic_chunk_latency=2.0)  # a wide window between the two chunks
    page = await open_page(server.url, width=PHONE_WIDTH, height=844)
    await page.get_by_role("tab", name="Generate").click()
    change, stop, generate = button(page, "Change prompt"), button(page, "Stop"), button(page, "Generate")
    await expect(change).to_be_disabled()
    await expect(stop).to_be_disabled()

    await generate.click()  # the page's own defaults: 66 frames, two chunks of 33
    await expect(generate).to_be_disabled()
    await expect(stop).to_be_enabled()
    await page.get_by_label("New prompt", exact=True).fill("a blue sea")
    await expect(change).to_be_enabled()
    # At 390x844 the playing video is in view, under the prompt and Stop and over the new prompt.
    await page.wait_for_function("() => document.getElementById('gen-video').videoWidth > 0", timeout=20_000)
    video, new_prompt = page.get_by_label("Generated video"), page.get_by_label("New prompt", exact=True)
    await assert_in_view_unscrolled(page, page.get_by_label("Prompt", exact=True), stop, video, new_prompt)

    # The engine has made every frame while they still play: a change has nothing left to apply to.
    await expect(page.locator("#gen-status")).to_contain_text("All 66 frames generated", timeout=20_000)
    await expect(change).to_be_disabled()
    await expect(page.get_by_label("New prompt", exact=True)).to_be_disabled()
    await expect(page.locator("#gen-change-hint")).to_contain_text("generated every frame")
    await assert_fits_phone_width(page)
    await screenshot(page, artifacts, "generate-phone.png")

    await expect(page.locator("#gen-status")).to_contain_text("Done", timeout=30_000)
    await expect(generate).to_be_enabled(timeout=10_000)
    await expect(stop).to_be_disabled()
    await expect(change).to_be_disabled()


async def test_an_ice_failure_is_reported_as_one(make_server: Any, open_page: PageFactory) -> None:
    server = await make_server()
    page = await open_page(server.url)

    async def wrong_ice_password(route: Any) -> None:
        # The server's checks still reach Chromium, but none of Chromium's checks can succeed.
        response = await route.fetch()
        answer = await response.json()
        answer["sdp"] = re.sub(r"a=ice-pwd:\S+", "a=ice-pwd:" + "0" * 24, answer["sdp"])
        await route.fulfill(response=response, json=answer)

    await page.route("**/v1/rtc/offer", wrong_ice_password)
    await button(page, "Connect").click()
    notice = page.locator("#talk-notice")
    await expect(notice).to_contain_text("none of the server's addresses (127.0.0.1:", timeout=30_000)
    await expect(notice).to_contain_text("ICE")
    # The test server's ICE is loopback-only (/v1/ice-servers says so): the hint names the flag, not TURN.
    await expect(notice).to_contain_text("restart it with --ice-address")
    await expect(notice).not_to_contain_text("timed out")
    await expect(button(page, "Connect")).to_be_enabled()


async def test_a_refused_session_shows_the_servers_reason(make_server: Any, open_page: PageFactory) -> None:
    server = await make_server(auth_token="s3cret")
    page = await open_page(server.url, expected_status=(401,))
    await button(page, "Connect").click()
    notice = page.locator("#talk-notice")
    await expect(notice).to_contain_text("The server refused the session: missing or wrong bearer token (HTTP 401)")
    await expect(notice).to_contain_text("Check the access token")
    await page.get_by_label("Access token").fill("s3cret")
    await connect_talk(page)


# Packets the page's microphone sent per second of audio it captured.
MIC_PACKETS_PER_SECOND = """async () => {
  let packets = 0, seconds = 0;
  (await window.rtcOmni.talk.session.pc.getStats()).forEach((s) => {
    if (s.type === "outbound-rtp" && s.kind === "audio") packets += s.packetsSent;
    if (s.type === "media-source" && s.kind === "audio") seconds += s.totalSamplesDuration;
  });
  return seconds > 0 ? packets / seconds : null;
}"""


async def test_the_microphone_sends_the_60_ms_packets_the_answer_asks_for(
    make_server: Any, open_page: PageFactory
) -> None:
    server = await make_server()
    page = await open_page(server.url)
    await connect_talk(page)
    await page.wait_for_timeout(1000)  # a second of audio, so the first packets weigh little
    rate = await page.evaluate(MIC_PACKETS_PER_SECOND)
    assert rate is not None and rate < 30, f"{rate} packets per second of audio: 50 means 20 ms packets"


# The server's port on the candidate pair the page's connection uses now.
SERVER_ICE_PORT = """async () => {
  const report = await window.rtcOmni.talk.session.pc.getStats();
  let port = null;
  report.forEach((s) => {
    if (s.type === "transport" && s.selectedCandidatePairId) {
      port = report.get(report.get(s.selectedCandidatePairId).remoteCandidateId).port;
    }
  });
  return port;
}"""

# Every text the state line shows from now on, into window.stateLine: a resume on loopback takes
# well under a second, which a poll for the text can miss.
RECORD_STATE_LINE = """() => {
  const line = document.getElementById("talk-state-text");
  window.stateLine = [];
  const record = () => window.stateLine.push(line.textContent);
  new MutationObserver(record).observe(line, {childList: true, characterData: true, subtree: true});
}"""


async def speaking_over_its_path(make_server: Any, open_page: PageFactory) -> tuple[Any, str, int]:
    """A page mid-answer: the page, its session id, and the server's port of its ICE pair."""
    server = await make_server()  # --resume-grace 30 s, the default
    page = await open_page(server.url)
    await connect_talk(page)
    session_id = await page.evaluate("window.rtcOmni.talk.session.sessionId")
    port = await page.evaluate(SERVER_ICE_PORT)
    assert isinstance(port, int), port
    await ask(page, "What colour do you see?")
    await expect(turn(page, 0)).to_have_attribute("data-state", "speaking", timeout=20_000)
    return page, session_id, port


async def the_conversation_goes_on(page: Any) -> None:
    """The answer cut into ends as it would have, its text shown once; the next is answered and heard
    (the talker meter, on the current connection's track, hears it)."""
    await expect(turn(page, 0)).to_have_attribute("data-state", "done", timeout=30_000)
    assert (await turn(page, 0).locator(".answer").inner_text()).count("You asked:") == 1
    await ask(page, "And now?")
    await expect(turn(page, 1).locator(".answer")).to_contain_text(f"mostly {CAMERA_COLOUR[0]}", timeout=20_000)
    await expect(turn(page, 1)).to_have_attribute("data-state", "speaking", timeout=20_000)


async def test_page_resumes_after_network_cut(make_server: Any, open_page: PageFactory) -> None:
    """The old path is cut for good mid-answer (as by a network change), so ICE consent cannot heal
    it: the page resumes the session on a new connection by itself, and the conversation goes on."""
    page, session_id, port = await speaking_over_its_path(make_server, open_page)
    await page.evaluate(RECORD_STATE_LINE)
    with udp_port_cut(port):
        await page.wait_for_function("() => window.rtcOmni.resumes >= 1", timeout=30_000)
        assert "Reconnecting…" in await page.evaluate("window.stateLine"), "the page never said it reconnects"
        await expect(page.locator("#hud-state")).to_have_text("connected")
        assert await page.evaluate("window.rtcOmni.talk.session.sessionId") == session_id
        assert await page.evaluate(SERVER_ICE_PORT) != port, "the resumed connection uses the cut path"
        await expect(page.locator("#talk-notice")).to_be_hidden()
        await the_conversation_goes_on(page)


async def test_page_goes_on_after_a_3_s_network_cut(make_server: Any, open_page: PageFactory) -> None:
    """The issue's own case: the page's path drops everything for 3 s mid-answer, then comes back.
    The call goes on without a click: ICE consent heals so short a cut before the page would resume
    (Chromium said `disconnected` 4-5 s into a cut here, and the page waits 2 s more), and if it resumed
    instead the session would be the same. The answer cut into still ends once, and the next is heard."""
    page, session_id, port = await speaking_over_its_path(make_server, open_page)
    with udp_port_cut(port):
        await asyncio.sleep(3.0)
    await expect(page.locator("#hud-state")).to_have_text("connected", timeout=15_000)
    assert await page.evaluate("window.rtcOmni.talk.session.sessionId") == session_id
    await the_conversation_goes_on(page)
