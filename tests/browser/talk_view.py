"""The Talk view connected as a user connects it, for the browser tests that ask it something.

It needs playwright: a test module imports it after its own guard, which skips without playwright."""

from __future__ import annotations

from playwright.async_api import Page, expect

# What the page shows and knows of its connection, for a failure's message.
PAGE_STATE = """() => {
  const talk = window.rtcOmni.talk, notice = document.getElementById("talk-notice");
  const pc = talk.session ? talk.session.pc : null;
  return {
    hud: document.getElementById("hud-state").textContent,
    notice: notice.hidden ? null : document.getElementById("talk-notice-text").textContent,
    configState: talk.configState,
    connection: pc && {state: pc.connectionState, ice: pc.iceConnectionState, sctp: pc.sctp && pc.sctp.state,
                       channel: talk.session.channel.readyState},
  };
}"""


async def connect_talk(page: Page) -> None:
    await page.get_by_role("button", name="Connect", exact=True).click()
    await expect(page.locator("#hud-state")).to_have_text("connected", timeout=20_000)
    try:
        await expect(page.locator("#talk-settings-state")).to_have_text("Applied.", timeout=10_000)
    except AssertionError as error:  # a CI run saw this once: say what the page knew
        raise AssertionError(f"the settings were not applied; the page: {await page.evaluate(PAGE_STATE)}") from error
    # The server needs one sampled camera frame before it can answer.
    await page.wait_for_function(
        "() => Number(document.getElementById('hud-buffered').textContent) >= 1", timeout=15_000
    )
