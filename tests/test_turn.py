"""TURN: ephemeral TURN REST credentials from GET /v1/ice-servers, WHIP Link headers, and a
relay-only client through a local coturn (turn/run-coturn.sh test) that completes a turn;
wrong or expired credentials end in a clear error instead of a hang."""

from __future__ import annotations

import asyncio
import base64
import hashlib
import hmac
import random
import socket
import time
from collections import deque
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from aiortc import RTCIceServer

from rtc_omni.client.media import COLOURS, ColourVideoTrack, ToneAudioTrack
from rtc_omni.client.rtc_peers import UnderstandClient
from rtc_omni.signaling.ice import advertise_public_addresses, turn_rest_credentials

from .conftest import RunningServer, ServerFactory, http_json
from .tools import require_loopback_namespace, require_tool
from .whip_client import SDP, http_raw, publisher_offer

SECRET = "turn-test-secret"
ROOT = Path(__file__).resolve().parent.parent


RELAY_PORTS = 200


def relay_ports_below_ephemeral(port: int) -> int:
    """The first of RELAY_PORTS relay ports for the coturn listening on `port`: below the kernel's
    ephemeral range, where every peer's ICE sockets land. coturn drops a relay port it cannot bind
    from its pool, and after a few such tries answers "no available ports": no relay candidate."""
    ephemeral_from = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    slots = max(1, (ephemeral_from - 10_000) // RELAY_PORTS)
    return 10_000 + (port % slots) * RELAY_PORTS


LISTEN_PORTS = range(6_000, 10_000)  # below the relay ports and the kernel's ephemeral range


def free_listening_port() -> int:
    """A port coturn can listen on, UDP and TCP both, outside the kernel's ephemeral range.

    A port the kernel handed out was once chosen here: any peer's ICE socket or client connection
    could take it, for TCP only, before coturn bound it, and coturn then served no allocation (a
    full suite run saw it). Ports below the range are taken only by a bind that names them."""
    for port in random.sample(LISTEN_PORTS, 64):
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as udp, socket.socket() as tcp:
            try:
                udp.bind(("127.0.0.1", port))
                tcp.bind(("127.0.0.1", port))
            except OSError:
                continue
        return port
    raise RuntimeError(f"no free port for coturn in {LISTEN_PORTS}")


@pytest.fixture
async def coturn(tmp_path: Path) -> AsyncIterator[str]:
    """A coturn on 127.0.0.1 with the test config; yields its TURN URL.

    Request it before `make_server`, so the server's peers release their allocations while it runs.
    Its last log lines are printed at the end, which pytest shows when a test failed.
    """
    require_loopback_namespace()
    require_tool("turnserver", "apt-get install coturn")
    port = free_listening_port()
    relay_from = relay_ports_below_ephemeral(port)
    process = await asyncio.create_subprocess_exec(
        str(ROOT / "turn" / "run-coturn.sh"),
        "test",
        f"--listening-port={port}",
        f"--min-port={relay_from}",
        f"--max-port={relay_from + RELAY_PORTS - 1}",
        f"--static-auth-secret={SECRET}",
        f"--pidfile={tmp_path / 'turnserver.pid'}",
        f"--userdb={tmp_path / 'turndb'}",
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    assert process.stdout is not None
    stdout = process.stdout
    log: deque[str] = deque(maxlen=80)

    async def keep_log() -> None:  # also keeps its pipe from filling
        while line := await stdout.readline():
            log.append(line.decode(errors="replace"))

    drain: asyncio.Future[None] | None = None
    try:
        async with asyncio.timeout(10):
            while b"Total General servers" not in (line := await stdout.readline()):
                assert line, "coturn exited before it was ready"
        drain = asyncio.ensure_future(keep_log())
        yield f"turn:127.0.0.1:{port}?transport=udp"
    finally:
        process.terminate()
        await process.wait()
        if drain is not None:
            drain.cancel()
        relays = f"{relay_from}-{relay_from + RELAY_PORTS - 1}"
        print(f"coturn on port {port}, relay ports {relays}, its last lines:\n{''.join(log)}")


async def test_ice_servers_endpoint_mints_turn_rest_credentials(make_server: ServerFactory) -> None:
    urls = ["stun:127.0.0.1:3478", "turn:127.0.0.1:3478?transport=udp"]
    server = await make_server(ice_server=urls, turn_secret=SECRET, turn_ttl=600)
    # Only settings are read: no peer is created, so nothing contacts these URLs.
    status, body = await http_json(server, "GET", "/v1/ice-servers")
    assert status == 200 and body["ttl"] == 600
    stun, turn = body["iceServers"]
    assert stun == {"urls": ["stun:127.0.0.1:3478"]}
    expiry, _name = turn["username"].split(":", 1)
    assert abs(int(expiry) - (time.time() + 600)) < 5
    expected = hmac.new(SECRET.encode(), turn["username"].encode(), hashlib.sha1).digest()
    assert base64.b64decode(turn["credential"]) == expected


def test_public_address_is_the_first_candidate() -> None:
    sdp = (
        "v=0\r\no=- 1 1 IN IP4 0.0.0.0\r\ns=-\r\nt=0 0\r\n"
        "m=audio 40000 UDP/TLS/RTP/SAVPF 111\r\nc=IN IP4 192.0.2.5\r\na=mid:0\r\na=rtpmap:111 opus/48000/2\r\n"
        "a=candidate:1 1 udp 2130706431 192.0.2.5 40000 typ host\r\na=end-of-candidates\r\n"
        "a=ice-ufrag:abcd\r\na=ice-pwd:abcdefghijklmnopqrstuvwx\r\n"
    )
    rewritten = advertise_public_addresses(sdp, ["203.0.113.7"])
    candidates = [line for line in rewritten.splitlines() if line.startswith("a=candidate:")]
    assert candidates[0].split()[4:8] == ["203.0.113.7", "40000", "typ", "host"]
    assert "192.0.2.5 40000 typ host" in candidates[1] and "c=IN IP4 203.0.113.7" in rewritten


async def test_whip_answer_advertises_the_public_address_first(make_server: ServerFactory) -> None:
    server = await make_server(ice_public_address=["203.0.113.7"])
    pc, offer = await publisher_offer(audio=False)
    try:  # the answer is only read, never applied: nothing is sent to 203.0.113.7
        status, _, answer = await http_raw(server, "POST", "/whip", data=offer, headers=SDP)
        first = next(line for line in answer.splitlines() if line.startswith("a=candidate:"))
        assert status == 201 and " 203.0.113.7 " in first and "typ host" in first
    finally:
        await pc.close()


async def relay_client(server: RunningServer, servers: list[RTCIceServer]) -> UnderstandClient:
    return UnderstandClient(
        server.url,
        video=ColourVideoTrack(COLOURS["blue"], 320, 240, 30),
        audio=ToneAudioTrack(440.0),
        ice_servers=servers,
        relay_only=True,
    )


async def test_relay_only_client_completes_a_turn_through_coturn(coturn: str, make_server: ServerFactory) -> None:
    server = await make_server(ice_server=[coturn], turn_secret=SECRET)
    publisher, whip_offer = await publisher_offer()
    status, headers, _ = await http_raw(server, "POST", "/whip", data=whip_offer, headers=SDP)
    await publisher.close()
    assert status == 201 and f'<{coturn}>; rel="ice-server"; username="' in headers["Link"]
    status, body = await http_json(server, "GET", "/v1/ice-servers")
    servers = [
        RTCIceServer(urls=s["urls"], username=s.get("username"), credential=s.get("credential"))
        for s in body["iceServers"]
    ]
    client = await relay_client(server, servers)
    try:
        await client.connect()
        offer = client.pc.localDescription.sdp
        assert "typ relay" in offer and "typ host" not in offer
        await client.configure(modalities=["text"])
        await client.wait_event("video.frame.ack")
        result = await client.ask("What colour is it?")
        assert "mostly blue" in result.text
    finally:
        await client.close()


@pytest.mark.parametrize("problem", ["wrong", "expired"])
async def test_bad_turn_credentials_fail_clearly(coturn: str, make_server: ServerFactory, problem: str) -> None:
    server = await make_server()
    if problem == "wrong":
        username, credential = turn_rest_credentials(SECRET, "user", 600)[0], "not-the-password"
    else:
        username, credential = turn_rest_credentials(SECRET, "user", 60, now=time.time() - 3600)
    client = await relay_client(server, [RTCIceServer(urls=coturn, username=username, credential=credential)])
    try:
        with pytest.raises(ConnectionError, match="no ICE candidates"):
            await client.connect(timeout=5)
        assert len(server.registry) == 0
    finally:
        await client.close()
