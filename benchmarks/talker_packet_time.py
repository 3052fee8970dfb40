"""What the talker's packet time costs at Chromium, and what it saves the server.

For each `--talker-packet-ms` (60 and 120, alternating, each with a fresh server): one Chromium Talk
session (fake camera and tone) asks a long question, and while the answer speaks (8 s, after 3 s
of it) the page's inbound-rtp audio stats give the talker's packets per second and the jitter
buffer's mean delay (`jitterBufferDelay / jitterBufferEmittedCount`: how long each sample waited
before playout), and /proc the server's CPU. The page's HUD gives the question -> first audio time.
Figures: docs/protocol.md, "Talker packet time".
Run inside the loopback namespace: python -m benchmarks.talker_packet_time [ROUNDS]
"""

from __future__ import annotations

import asyncio
import sys
from typing import Any

from playwright.async_api import async_playwright, expect

from benchmarks.browser_camera_cpu import cpu_seconds
from rtc_omni.bench.common import server
from tests.browser.conftest import CHROMIUM, CHROMIUM_FLAGS
from tests.browser.test_page import LONG_QUESTION, ask, connect_talk, turn

SPEAKING_S = 8.0

TALKER_STATS = """async () => {
  let found = null;
  (await window.rtcOmni.talk.session.pc.getStats()).forEach((s) => {
    if (s.type === "inbound-rtp" && s.kind === "audio") found = {
      packets: s.packetsReceived, delay: s.jitterBufferDelay, emitted: s.jitterBufferEmittedCount,
      target: s.jitterBufferTargetDelay,
    };
  });
  return found;
}"""


async def measure(browser: Any, packet_ms: int) -> str:
    with server(["--talker-packet-ms", str(packet_ms)]) as (process, url):
        return await measure_session(browser, url, process.pid, packet_ms)


async def measure_session(browser: Any, url: str, server_pid: int, packet_ms: int) -> str:
    context = await browser.new_context()
    try:
        page = await context.new_page()
        await page.goto(url + "/")
        await connect_talk(page)
        await ask(page, LONG_QUESTION)
        await expect(turn(page, 0)).to_have_attribute("data-state", "speaking", timeout=20_000)
        await asyncio.sleep(3.0)
        before, cpu = await page.evaluate(TALKER_STATS), cpu_seconds(server_pid)
        await asyncio.sleep(SPEAKING_S)
        after, cpu = await page.evaluate(TALKER_STATS), cpu_seconds(server_pid) - cpu
        first_audio = await page.locator("#hud-first-audio").text_content()
        delay_ms = (after["delay"] - before["delay"]) / (after["emitted"] - before["emitted"]) * 1000
        target_ms = after["target"] / after["emitted"] * 1000
        return (
            f"{packet_ms:3} ms packets: {(after['packets'] - before['packets']) / SPEAKING_S:4.1f} packets/s, "
            f"Chromium's jitter buffer delay {delay_ms:5.1f} ms (target {target_ms:5.1f}), "
            f"question -> first audio {first_audio}, server {cpu / SPEAKING_S:.3f} CPU-s/s"
        )
    finally:
        await context.close()


async def main(rounds: int) -> None:
    async with async_playwright() as playwright:
        browser = await playwright.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_FLAGS)
        for _ in range(rounds):
            for packet_ms in (60, 120):
                print(await measure(browser, packet_ms), flush=True)
        await browser.close()


if __name__ == "__main__":
    asyncio.run(main(int(sys.argv[1]) if len(sys.argv) > 1 else 2))
