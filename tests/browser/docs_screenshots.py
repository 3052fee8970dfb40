"""The screenshots in docs/browser.md: Talk while the talker speaks, Generate after a prompt change,
at desktop (1280x800, the viewport) and phone (390x844, the full page) widths.

Run inside the loopback-only namespace, like the browser tests:
    ip netns exec rtcomni python -m tests.browser.docs_screenshots docs/img
It starts `rtc-omni serve` (synthetic engines, espeak-ng voice) on 127.0.0.1 and drives Chromium
with the tests' fake camera and microphone.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

from playwright.async_api import async_playwright, expect

from .conftest import CAMERA_COLOUR, CHROMIUM, MIC_TONE_HZ, chromium_flags, write_tone_wav, write_y4m

PORT = 18777
URL = f"http://127.0.0.1:{PORT}/"
SIZES = [("desktop", 1280, 800, False), ("phone", 390, 844, True)]  # name, width, height, full page


def start_server(log: Path) -> subprocess.Popen[bytes]:
    command = ["rtc-omni", "serve", "--host", "127.0.0.1", "--port", str(PORT), "--ice-address", "127.0.0.1"]
    command += ["--synthetic-voice", "espeak", "--synthetic-chunk-latency", "1.5", "--session-rate-limit", "0"]
    server = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=log.open("w"))
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        try:
            urllib.request.urlopen(URL, timeout=1)
            return server
        except OSError:
            time.sleep(0.2)
    server.terminate()
    raise SystemExit(f"rtc-omni serve did not start; see {log}")


async def talk(page: Any, path: Path, full_page: bool) -> None:
    await page.get_by_role("button", name="Connect", exact=True).click()
    await page.get_by_label("Question", exact=True).fill("What do you see?")
    await expect(page.get_by_role("button", name="Ask", exact=True)).to_be_enabled(timeout=20_000)
    # Once the still camera's frames are filtered, the turn says why it sees 1 of 4 frames.
    await page.wait_for_function("() => Number(document.getElementById('hud-filtered').textContent) >= 1")
    await page.get_by_label("Question", exact=True).press("Enter")
    await expect(page.locator("#talk-state")).to_have_attribute("data-state", "speaking", timeout=20_000)
    await page.wait_for_function(
        "() => Number(document.getElementById('talker-level').getAttribute('aria-valuenow')) > 40", timeout=5_000
    )
    await page.screenshot(path=str(path), full_page=full_page)
    await page.get_by_role("button", name="Disconnect", exact=True).click()


async def generate(page: Any, path: Path, full_page: bool) -> None:
    await page.get_by_role("tab", name="Generate").click()
    await page.get_by_label("Frames", exact=True).fill("99")
    await page.get_by_role("button", name="Generate", exact=True).click()
    await page.get_by_label("New prompt", exact=True).fill("a blue sea")
    await page.get_by_role("button", name="Change prompt", exact=True).click()
    await expect(page.locator("#gen-events")).to_contain_text("applied", timeout=20_000)
    await page.wait_for_timeout(1500)  # the blue chunk on screen
    await page.screenshot(path=str(path), full_page=full_page)


async def main(out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as folder:
        camera, mic = Path(folder) / "camera.y4m", Path(folder) / "mic.wav"
        write_y4m(camera, CAMERA_COLOUR[1])
        write_tone_wav(mic, MIC_TONE_HZ)
        server = start_server(Path(folder) / "server.log")
        flags = chromium_flags(camera, mic)
        try:
            async with async_playwright() as playwright:
                browser = await playwright.chromium.launch(executable_path=CHROMIUM, headless=True, args=flags)
                for name, width, height, full_page in SIZES:
                    context = await browser.new_context(viewport={"width": width, "height": height})
                    page = await context.new_page()
                    page.set_default_timeout(15_000)
                    await page.goto(URL)
                    if not full_page:  # the viewport shows the conversation, not the settings
                        await page.evaluate("document.querySelector('details.settings').open = false")
                    await talk(page, out / f"talk-{name}.png", full_page)
                    await generate(page, out / f"generate-{name}.png", full_page)
                    await context.close()
                await browser.close()
        finally:
            server.terminate()
            server.wait(10)
    for path in sorted(out.glob("*.png")):
        print(f"{path}: {path.stat().st_size // 1024} KB")


if __name__ == "__main__":
    asyncio.run(main(Path(sys.argv[1] if len(sys.argv) > 1 else "docs/img")))
