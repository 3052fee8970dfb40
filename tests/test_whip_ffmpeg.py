"""Interop: FFmpeg 8's WHIP muxer publishes to /whip with a Bearer token; a controller attaches,
asks, and hears about the colour and the tone; FFmpeg's DELETE ends the session and frees it."""

from __future__ import annotations

import asyncio
import datetime
import sys
from pathlib import Path

import av
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from rtc_omni.client.peer import UnderstandClient

from .conftest import ServerFactory
from .netns import require_loopback_namespace
from .test_lifecycle import server_tasks, wait_until

TOKEN = "ffmpeg-token"
PUBLISH_SECONDS = 12


def write_ecdsa_certificate(directory: Path) -> tuple[Path, Path]:
    """A P-256 ECDSA certificate: FFmpeg's own generated one fails DTLS against aiortc."""
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "ffmpeg-whip")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(days=1))
        .not_valid_after(now + datetime.timedelta(days=30))
        .sign(key, hashes.SHA256())
    )
    cert_path, key_path = directory / "whip_cert.pem", directory / "whip_key.pem"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    return cert_path, key_path


@pytest.mark.timeout(90)
async def test_ffmpeg_whip_publisher_is_understood(make_server: ServerFactory, tmp_path: Path) -> None:
    require_loopback_namespace()
    if "whip" not in av.formats_available:
        pytest.fail("PyAV's FFmpeg has no whip muxer")
    server = await make_server(auth_token=TOKEN)
    cert, key = write_ecdsa_certificate(tmp_path)
    publisher = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "tests.ffmpeg_whip_publisher",
        f"{server.url}/whip",
        TOKEN,
        str(cert),
        str(key),
        str(PUBLISH_SECONDS),
        cwd=Path(__file__).resolve().parent.parent,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    controller = UnderstandClient(server.url, video=None, audio=None, token=TOKEN)
    try:
        await wait_until(lambda: len(server.registry) == 1 or publisher.returncode is not None, timeout=15)
        assert len(server.registry) == 1, "the publisher never created a session"
        session_id = next(iter(server.registry))
        peer = server.registry.get(session_id)
        await wait_until(lambda: peer.pc.connectionState == "connected", timeout=15)

        await controller.connect(kind="control", session_id=session_id)
        await controller.wait_event("video.frame.ack", timeout=10)
        await asyncio.sleep(1.0)  # a second of the tone in the audio buffer
        result = await controller.ask("What do you see and hear?")
        assert "mostly red" in result.text, result.text
        assert "dominant frequency about 440 Hz" in result.text, result.text

        async with asyncio.timeout(PUBLISH_SECONDS + 20):
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
        await controller.close()
