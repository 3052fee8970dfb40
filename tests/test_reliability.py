"""Limits, faults and shutdown: a server that meets broken clients keeps serving and frees what it held."""

from __future__ import annotations

import asyncio
import re

import aiohttp
import pytest

from rtc_omni.client.rtc_peers import UnderstandClient

from .conftest import ClientFactory, RunningServer, ServerFactory, http_json
from .waiting import server_tasks, wait_until


async def test_oversized_bodies_get_413(server: RunningServer) -> None:
    huge = {"sdp": "v=0\r\n" + "a=x\r\n" * 80_000, "type": "offer", "kind": "understand"}
    status, body = await http_json(server, "POST", "/v1/rtc/offer", json=huge)
    assert status == 413
    status, _ = await http_json(
        server, "POST", "/whip", data="v=0\r\n" + "a=x\r\n" * 80_000, headers={"Content-Type": "application/sdp"}
    )
    assert status == 413
    assert len(server.registry) == 0


async def test_session_creation_is_rate_limited_per_client(make_server: ServerFactory) -> None:
    server = await make_server(session_rate_limit=2)
    statuses = []
    for _ in range(3):
        status, body = await http_json(
            server, "POST", "/v1/rtc/offer", data="not json", headers={"Content-Type": "application/json"}
        )
        statuses.append(status)
    assert statuses == [400, 400, 429]
    async with aiohttp.ClientSession() as http:
        async with http.post(server.url + "/v1/rtc/offer", data="x") as response:
            assert response.status == 429 and int(response.headers["Retry-After"]) >= 1
        async with http.get(server.url + "/healthz") as response:
            assert response.status == 200  # only session creation is limited


async def test_cors_allows_only_listed_origins(make_server: ServerFactory) -> None:
    server = await make_server(cors_origin=["https://app.example"])
    preflight = {"Access-Control-Request-Method": "POST", "Access-Control-Request-Headers": "content-type"}
    async with aiohttp.ClientSession() as http:
        async with http.options(
            server.url + "/v1/rtc/offer", headers={"Origin": "https://app.example", **preflight}
        ) as r:
            assert r.status == 204 and r.headers["Access-Control-Allow-Origin"] == "https://app.example"
            assert "POST" in r.headers["Access-Control-Allow-Methods"]
        sdk_headers = {**preflight, "Access-Control-Request-Headers": "authorization, x-openai-agents-sdk"}
        async with http.options(
            server.url + "/v1/realtime/calls", headers={"Origin": "https://app.example", **sdk_headers}
        ) as r:  # the OpenAI Agents SDK's own header: without it the browser never sends the offer
            assert r.status == 204 and "x-openai-agents-sdk" in r.headers["Access-Control-Allow-Headers"]
        async with http.options(
            server.url + "/v1/rtc/offer", headers={"Origin": "https://evil.example", **preflight}
        ) as r:
            assert r.status == 403 and "Access-Control-Allow-Origin" not in r.headers
        async with http.options(server.url + "/whip", headers={"Origin": "https://evil.example", **preflight}) as r:
            assert r.status == 403
        async with http.get(server.url + "/healthz", headers={"Origin": "https://evil.example"}) as r:
            assert "Access-Control-Allow-Origin" not in r.headers
        async with http.get(server.url + "/healthz", headers={"Origin": "https://app.example"}) as r:
            assert r.headers["Access-Control-Allow-Origin"] == "https://app.example"
            assert "Location" in r.headers["Access-Control-Expose-Headers"]  # a page reads its call's URL


async def test_shutdown_tells_every_session_then_closes_it(
    make_server: ServerFactory, make_client: ClientFactory
) -> None:
    server = await make_server()
    first = await make_client(server, colour="red", tone=None, config={})
    second = await make_client(server, colour="blue", tone=None, config={})
    await first.wait_event("video.frame.ack")
    await server.server.close()
    for client in (first, second):
        error = await client.wait_event("error", timeout=5)
        assert error["message"] == "Server shutting down"
    assert len(server.registry) == 0 and server_tasks() == []


async def test_the_media_goes_on_when_the_datachannel_closes(server: RunningServer, make_client: ClientFactory) -> None:
    client = await make_client(server, colour="red", tone=440.0, config={})
    await client.wait_event("video.frame.ack")
    client.channel.close()
    path = f"/v1/rtc/sessions/{client.session_id}"
    before = (await http_json(server, "GET", path, headers=client.session_headers))[1]
    await asyncio.sleep(1.5)
    status, after = await http_json(server, "GET", path, headers=client.session_headers)
    assert status == 200 and after["connection_state"] == "connected"
    assert after["frames_received"] > before["frames_received"] + 4  # the camera sends 5 fps at sample_fps 2
    assert after["audio_ms_buffered"] > before["audio_ms_buffered"]


@pytest.mark.media
async def test_a_failed_dtls_handshake_frees_the_session(make_server: ServerFactory) -> None:
    server = await make_server(ice_connect_timeout=10)
    client = UnderstandClient(server.url, audio=None)
    client.pc.addTransceiver("audio", direction="recvonly")
    await client.pc.setLocalDescription(await client.pc.createOffer())
    # Another certificate's fingerprint: ICE succeeds, DTLS cannot.
    forged = re.sub(
        r"(a=fingerprint:sha-256 )[0-9A-F:]+",
        lambda m: m.group(1) + ":".join(["AB"] * 32),
        client.pc.localDescription.sdp,
    )
    status, body = await http_json(
        server, "POST", "/v1/rtc/offer", json={"sdp": forged, "type": "offer", "kind": "understand"}
    )
    assert status == 200
    from aiortc import RTCSessionDescription

    await client.pc.setRemoteDescription(RTCSessionDescription(sdp=body["sdp"], type="answer"))
    await wait_until(lambda: body["session_id"] not in server.registry, timeout=15)
    await client.close()
    assert server_tasks() == []


@pytest.mark.media
async def test_a_peer_that_vanishes_is_freed_within_the_silence_timeout(make_server: ServerFactory) -> None:
    import signal
    import subprocess
    import sys
    import time

    server = await make_server(peer_silence_timeout=2.0, resume_grace=0)  # freed at once, not kept for a resume
    client = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "rtc_omni",
            "client",
            "understand",
            "--server",
            server.url,
            "--video",
            "colour:red",
            "--width",
            "160",
            "--height",
            "120",
            "--query",
            "hi",
            "--warmup",
            "60",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        await wait_until(lambda: len(server.registry) == 1, timeout=20)
        await asyncio.sleep(1.0)
        killed_at = time.monotonic()
        client.send_signal(signal.SIGKILL)  # no DTLS close, no DELETE, no goodbye at all
        await wait_until(lambda: len(server.registry) == 0, timeout=10)
        freed_after = time.monotonic() - killed_at
    finally:
        client.kill()
        client.wait()
    assert freed_after < 10  # well before aiortc's ~30 s consent failure
    assert server_tasks() == []
