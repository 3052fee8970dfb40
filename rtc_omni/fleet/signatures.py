"""The signature on a request one gateway forwards to another: proof that a node of the fleet sent it.

The header reads `<node> <unix time> <HMAC-SHA256 of node, time, method and path>` under a key
derived from the cluster key (nodes.py): the key itself never travels, and a signature is good for
one method and path for SIGNATURE_WINDOW_S either side of the receiver's clock (run NTP). A node
believes the client address a signed request carries, and never forwards it again.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import time

SIGNATURE_HEADER = "RTC-Omni-Gateway-Signature"
SIGNATURE_WINDOW_S = 60


def _mac(key: bytes, node: str, at: int, method: str, path_qs: str) -> str:
    digest = hmac.new(key, f"{node}\n{at}\n{method}\n{path_qs}".encode(), hashlib.sha256).digest()
    return base64.urlsafe_b64encode(digest).rstrip(b"=").decode()


def signature(key: bytes, node: str, method: str, path_qs: str, now: float | None = None) -> str:
    """The header value with which `node` forwards `method path_qs` now."""
    at = int(time.time() if now is None else now)
    return f"{node} {at} {_mac(key, node, at, method, path_qs)}"


def signer(key: bytes | None, header: str, method: str, path_qs: str, now: float | None = None) -> str | None:
    """The node that signed `method path_qs` with `header`; None for a wrong key, a stale time or no key here."""
    node, _, rest = header.strip().partition(" ")
    at_text, _, mac = rest.partition(" ")
    if key is None or not at_text.isdigit():
        return None
    at = int(at_text)
    if abs((time.time() if now is None else now) - at) > SIGNATURE_WINDOW_S:
        return None
    return node if hmac.compare_digest(mac.encode(), _mac(key, node, at, method, path_qs).encode()) else None
