"""The server serves the browser client, and the client loads nothing from elsewhere (no browser needed)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import aiohttp

from rtc_omni.app import STATIC_DIR

from .conftest import BROWSER_LOOP


async def fetch(server: Any, path: str) -> tuple[int, str, str]:
    async with aiohttp.ClientSession() as http:
        async with http.get(server.url + path) as response:
            return response.status, response.headers.get("Content-Type", ""), await response.text()


@BROWSER_LOOP  # this folder's make_server runs in the module's loop
async def test_root_serves_the_page_and_every_asset_it_loads(make_server: Any) -> None:
    server = await make_server()
    status, content_type, html = await fetch(server, "/")
    assert status == 200 and content_type.startswith("text/html")
    assets = re.findall(r'(?:src|href)="(static/[^"]+)"', html)
    assert "static/js/main.js" in assets and "static/app.css" in assets
    # Follow the module graph: every relative import must be served as JavaScript.
    pending, seen = [a for a in assets if a.endswith(".js")], set()
    while pending:
        path = pending.pop()
        if path in seen:
            continue
        seen.add(path)
        status, content_type, source = await fetch(server, "/" + path)
        assert status == 200, path
        assert "javascript" in content_type, (path, content_type)
        folder = path.rsplit("/", 1)[0]
        pending += [f"{folder}/{name.removeprefix('./')}" for name in re.findall(r'from "(\./[^"]+)"', source)]
    assert {"static/js/talk.js", "static/js/generate.js", "static/js/rtc.js", "static/js/api.js"} <= seen
    status, content_type, _ = await fetch(server, "/static/app.css")
    assert status == 200 and content_type.startswith("text/css")


def test_the_client_loads_nothing_from_other_origins() -> None:
    files = [p for p in STATIC_DIR.rglob("*") if p.is_file()]
    assert files
    for path in files:
        text = Path(path).read_text()
        assert not re.search(r"(https?:)?//[a-z0-9.-]+\.[a-z]{2,}/", text, re.IGNORECASE), path
