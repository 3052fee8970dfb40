"""Interop: FFmpeg 8's WHIP muxer publishes to /whip with a Bearer token; a controller attaches,
asks, and hears about the colour and the tone; FFmpeg's DELETE ends the session and frees it.
FFmpeg answers no ICE consent checks: a long publish outlives consent expiry, and a publisher
killed without DELETE is freed once its media stops. The controller asks for text only: these tests
are about what the publisher sends, not about speech."""

from __future__ import annotations

import asyncio
import logging
import sys
import time
from pathlib import Path

import aioice.ice
import av
import pytest

from .conftest import RunningServer, ServerFactory
from .https_server import self_signed
from .tools import require_loopback_namespace, unavailable
from .waiting import server_tasks, wait_until
from .whip_client import ask_about_colour_and_tone

pytestmark = pytest.mark.media

TOKEN = "ffmpeg-token"
PUBLISH_SECONDS = 30  # at most: the test closes the publisher's stdin once the controller has asked


async def start_publisher(server: RunningServer, directory: Path, seconds: float) -> asyncio.subprocess.Process:
    """FFmpeg's WHIP muxer publishing red and 440 Hz to the server for `seconds`, in a subprocess; closing
    its stdin stops it sooner."""
    require_loopback_namespace()
    if "whip" not in av.formats_available:
        unavailable(f"PyAV {av.__version__}'s FFmpeg has no whip muxer (pip install -U av: its wheels bundle FFmpeg 8)")
    # A P-256 ECDSA certificate: FFmpeg's own generated one fails DTLS against aiortc.
    whip = self_signed(directory, "whip")
    cert, key = whip.cert, whip.key
    return await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "tests.ffmpeg_whip_publisher",
        f"{server.url}/whip",
        TOKEN,
        str(cert),
        str(key),
        str(seconds),
        cwd=Path(__file__).resolve().parent.parent,
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )


@pytest.mark.timeout(90)
async def test_ffmpeg_whip_publisher_is_understood(make_server: ServerFactory, tmp_path: Path) -> None:
    server = await make_server(auth_token=TOKEN)
    publisher = await start_publisher(server, tmp_path, PUBLISH_SECONDS)
    try:
        await wait_until(lambda: len(server.registry) == 1 or publisher.returncode is not None, timeout=15)
        assert len(server.registry) == 1, "the publisher never created a session"
        session_id = next(iter(server.registry))
        peer = server.registry.get(session_id)
        await wait_until(lambda: peer.pc.connectionState == "connected", timeout=15)
        await ask_about_colour_and_tone(server, session_id, TOKEN)

        assert publisher.stdin is not None
        publisher.stdin.close()  # it stops publishing and sends DELETE
        async with asyncio.timeout(20):
            output, _ = await publisher.communicate()
        assert publisher.returncode == 0, output.decode(errors="replace")[-2000:]
        await wait_until(lambda: session_id not in server.registry, timeout=5)  # FFmpeg sent DELETE
        assert peer.closed.is_set() and peer.pc.connectionState == "closed"
        assert peer.session.state == "closed" and not peer.attached
        await wait_until(lambda: not server_tasks(), timeout=5)
    finally:
        if publisher.returncode is None:
            publisher.kill()
            await publisher.wait()


# aioice checks consent every CONSENT_INTERVAL (5 s), each check waiting 0.5 s for its answer, and gives
# up after CONSENT_FAILURES (6) unanswered checks: ~33 s. Checking every 0.5 s expires it in ~6 s, the
# same code path in a fifth of the time (the server runs in this process).
CONSENT_INTERVAL_S = 0.5
LONG_PUBLISH_S = 10.0  # past that consent expiry
RESUME_GRACE_S = 1.0
MEDIA_TIMEOUT_S = 3.0


@pytest.mark.timeout(90)
async def test_ffmpeg_publisher_outlives_consent_expiry_and_is_freed_when_killed(
    make_server: ServerFactory, tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(aioice.ice, "CONSENT_INTERVAL", CONSENT_INTERVAL_S)
    caplog.set_level(logging.INFO, logger="rtc_omni.patches.ice_candidates")
    # Killed, it is taken for lost after MEDIA_TIMEOUT_S, and freed when its resume grace runs out.
    server = await make_server(auth_token=TOKEN, publisher_media_timeout=MEDIA_TIMEOUT_S, resume_grace=RESUME_GRACE_S)
    publisher = await start_publisher(server, tmp_path, 2 * LONG_PUBLISH_S)
    try:
        await wait_until(lambda: len(server.registry) == 1 or publisher.returncode is not None, timeout=15)
        assert len(server.registry) == 1, "the publisher never created a session"
        session_id = next(iter(server.registry))
        peer = server.registry.get(session_id)
        await wait_until(lambda: peer.pc.connectionState == "connected", timeout=15)
        connected_at = time.monotonic()

        await asyncio.sleep(LONG_PUBLISH_S - (time.monotonic() - connected_at))
        assert "media keeps arriving: connection kept" in caplog.text  # consent did expire
        assert session_id in server.registry and peer.pc.connectionState == "connected"
        await ask_about_colour_and_tone(server, session_id, TOKEN)

        publisher.kill()  # gone without DELETE
        killed_at = time.monotonic()
        await wait_until(lambda: session_id not in server.registry, timeout=MEDIA_TIMEOUT_S + RESUME_GRACE_S + 5)
        assert time.monotonic() - killed_at < MEDIA_TIMEOUT_S + RESUME_GRACE_S + 3
        assert peer.closed.is_set() and peer.pc.connectionState == "closed"
        await wait_until(lambda: not server_tasks(), timeout=5)
    finally:
        if publisher.returncode is None:
            publisher.kill()
        await publisher.wait()
