"""A self-signed certificate for 127.0.0.1, and `rtc-omni serve` as a process, as the HTTPS tests run them."""

from __future__ import annotations

import base64
import contextlib
import datetime
import hashlib
import os
import select
import ssl
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from ipaddress import IPv4Address
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

RTC_OMNI = [sys.executable, "-m", "rtc_omni"]  # the `rtc-omni` console script, from this source tree
BANNER = "rtc-omni: engine="
START_TIMEOUT_S = 30.0


@dataclass(frozen=True)
class Certificate:
    cert: Path
    key: Path
    spki_sha256: str  # base64, as Chromium's --ignore-certificate-errors-spki-list takes it

    def client_context(self) -> ssl.SSLContext:
        """A client context that trusts this certificate alone."""
        return ssl.create_default_context(cafile=str(self.cert))


def self_signed(folder: Path, name: str = "server") -> Certificate:
    """A certificate for 127.0.0.1 and localhost, valid for a day, and its key, written into `folder`
    as NAME-cert.pem and NAME-key.pem."""
    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")])
    now = datetime.datetime.now(datetime.UTC)
    alt_names = x509.SubjectAlternativeName([x509.IPAddress(IPv4Address("127.0.0.1")), x509.DNSName("localhost")])
    certificate = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(alt_names, critical=False)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    cert_path, key_path = folder / f"{name}-cert.pem", folder / f"{name}-key.pem"
    cert_path.write_bytes(certificate.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    spki = key.public_key().public_bytes(serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)
    return Certificate(cert_path, key_path, base64.b64encode(hashlib.sha256(spki).digest()).decode())


@contextlib.contextmanager
def rtc_omni_serve(*args: str, log: Path) -> Iterator[tuple[str, str]]:
    """`rtc-omni serve ARGS --port 0` until the block ends: its URL from the ready banner, and what it
    printed to stderr before it (its warnings); its stderr goes on into `log`."""
    with log.open("w") as stderr:
        process = subprocess.Popen(
            [*RTC_OMNI, "serve", "--synthetic-voice", "tone", *args, "--port", "0"],
            stdout=subprocess.PIPE,
            stderr=stderr,
            text=True,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
        try:
            assert process.stdout is not None
            ready, _, _ = select.select([process.stdout], [], [], START_TIMEOUT_S)
            banner = process.stdout.readline() if ready else ""
            assert banner.startswith(BANNER), (
                f"no ready banner within {START_TIMEOUT_S} s: {banner!r}\n{log.read_text()}"
            )
            yield banner.rsplit(" on ", 1)[1].split()[0], log.read_text()
        finally:
            process.kill()
            process.wait()
