"""HTTPS for one box: the SSL context `rtc-omni serve --tls-cert/--tls-key` listens with.

Browsers give the camera and microphone only to https pages (or localhost); behind a reverse proxy
that terminates TLS instead, see docs/deployment.md ("HTTPS").
"""

from __future__ import annotations

import ssl


class TlsFilesError(ValueError):
    """The certificate or key cannot be used; the message names the flag and what is wrong."""


def server_ssl_context(cert: str, key: str) -> ssl.SSLContext:
    """A server context with the certificate chain in `cert` (PEM) and its private key in `key`."""
    for flag, path in (("--tls-cert", cert), ("--tls-key", key)):
        try:
            with open(path, "rb"):
                pass
        except OSError as exc:
            raise TlsFilesError(f"{flag} {path}: {exc.strerror or exc}") from None
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    try:
        context.load_cert_chain(cert, key)
    except ssl.SSLError as exc:
        if exc.reason == "KEY_VALUES_MISMATCH":
            raise TlsFilesError(f"--tls-key {key} is not the private key of --tls-cert {cert}") from None
        raise TlsFilesError(
            f"--tls-cert {cert} and --tls-key {key} must be a PEM certificate chain and a PEM private key "
            f"(OpenSSL: {exc.reason or exc.args[-1]})"
        ) from None
    return context
