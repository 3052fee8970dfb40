"""Server CPU and camera bitrate for one Chromium Talk session: the page as it was, and as it is.

`before`: the camera at its capture rate (maxFramerate set to 30 after connecting, contentHint
cleared) and no bitrate cap (`--max-video-bitrate 0`), which is what the page and server did before
issue 17. `now`: the page's maxFramerate from sample_fps (2 -> 5 fps) and the default 300 kb/s cap.
Chromium's own fake camera (a moving 640x480 pattern, 30 fps) and tone; `rtc-omni serve` runs as a
subprocess on 127.0.0.1, and its CPU is read from /proc. Figures: docs/protocol.md.
Run inside the loopback namespace: python -m benchmarks.browser_camera_cpu [SECONDS]
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import urllib.request
from typing import Any

from playwright.async_api import async_playwright, expect

from rtc_omni.bench.common import server
from tests.browser.conftest import CHROMIUM, CHROMIUM_FLAGS

WARMUP_S = 4.0
FLAGS = [f for f in CHROMIUM_FLAGS if f != "--use-fake-device-for-media-stream"]
FLAGS.append("--use-fake-device-for-media-stream=fps=30")

AS_BEFORE = """async () => {
  const sender = window.rtcOmni.talk.cameraSender;
  sender.track.contentHint = "";
  const parameters = sender.getParameters();
  parameters.encodings[0].maxFramerate = 30;
  await sender.setParameters(parameters);
}"""

OUTBOUND = """async () => {
  let found = null;
  (await window.rtcOmni.talk.session.pc.getStats()).forEach((s) => {
    if (s.type === "outbound-rtp" && s.kind === "video") found = [s.frameWidth, s.frameHeight, s.framesPerSecond];
  });
  return found;
}"""


def cpu_seconds(pid: int) -> float:
    fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime + stime


def session_stats(url: str, session_id: str, token: str) -> dict[str, Any]:
    headers = {"Authorization": f"Bearer {token}"}
    request = urllib.request.Request(f"{url}/v1/rtc/sessions/{session_id}", headers=headers)
    with urllib.request.urlopen(request, timeout=5) as response:
        return json.load(response)  # type: ignore[no-any-return]


async def measure(browser: Any, mode: str, seconds: float) -> str:
    with server(["--max-video-bitrate", "0" if mode == "before" else "300"]) as (process, url):
        return await measure_session(browser, url, process.pid, mode, seconds)


async def measure_session(browser: Any, url: str, server_pid: int, mode: str, seconds: float) -> str:
    context = await browser.new_context()
    try:
        page = await context.new_page()
        await page.goto(url + "/")
        await page.get_by_role("button", name="Connect", exact=True).click()
        await expect(page.locator("#talk-settings-state")).to_have_text("Applied.", timeout=20_000)
        if mode == "before":
            await page.evaluate(AS_BEFORE)
        session_id = await page.evaluate("window.rtcOmni.talk.session.sessionId")
        token = await page.evaluate("window.rtcOmni.talk.session.sessionToken")
        await asyncio.sleep(WARMUP_S)
        cpu, stats = cpu_seconds(server_pid), session_stats(url, session_id, token)
        await asyncio.sleep(seconds)
        cpu, after = cpu_seconds(server_pid) - cpu, session_stats(url, session_id, token)
        width, height, fps = await page.evaluate(OUTBOUND)
        return (
            f"{mode:6} server {cpu / seconds:.3f} CPU-s/s, "
            f"{(after['bytes_received'] - stats['bytes_received']) * 8 / 1000 / seconds:4.0f} kb/s in, "
            f"{(after['frames_received'] - stats['frames_received']) / seconds:4.1f} fps received; "
            f"Chromium sends {width}x{height} at {fps} fps"
        )
    finally:
        await context.close()


async def main(seconds: float) -> None:
    async with async_playwright() as playwright:
        browser = await playwright.chromium.launch(executable_path=CHROMIUM, headless=True, args=FLAGS)
        for mode in ("before", "now", "before", "now"):
            print(await measure(browser, mode, seconds), flush=True)
        await browser.close()


if __name__ == "__main__":
    asyncio.run(main(float(sys.argv[1]) if len(sys.argv) > 1 else 20.0))
