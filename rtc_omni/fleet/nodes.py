"""Who a gateway is in its fleet: its node id, its peers' URLs, and the keys it derives from the cluster key."""

from __future__ import annotations

import hashlib
import hmac
from dataclasses import dataclass

from ..config import Settings

# What each derived key is for: one secret, two keys, so that no token can pass for a signature.
_TOKENS = b"rtc-omni session and view tokens"
_REQUESTS = b"rtc-omni requests between gateways"


def _derived(cluster_key: str, purpose: bytes) -> bytes:
    return hmac.new(cluster_key.encode(), purpose, hashlib.sha256).digest()


@dataclass(frozen=True)
class Fleet:
    """This gateway as a node of the fleet (`--node-id`), and the nodes it forwards to (`--peer`)."""

    node_id: str
    peers: dict[str, str]  # node id -> base URL, this node left out
    token_key: bytes | None  # the session/view token HMAC key; None: this process draws its own
    request_key: bytes | None  # signs the requests forwarded between gateways (signatures.py)

    @classmethod
    def of(cls, settings: Settings) -> Fleet | None:
        """The fleet the settings describe; None without --node-id (a gateway on its own)."""
        if settings.node_id is None:
            return None
        key = settings.cluster_key
        return cls(
            settings.node_id,
            settings.peers,
            None if key is None else _derived(key, _TOKENS),
            None if key is None else _derived(key, _REQUESTS),
        )

    @property
    def session_id_prefix(self) -> str:
        return f"{self.node_id}."

    def owner_of(self, session_id: str) -> tuple[str | None, str | None]:
        """(the peer that made `session_id`, or None; the rest of the id past this node's prefix, or None
        when another node, or none of the fleet, made it)."""
        node, dot, rest = session_id.partition(".")
        if not dot:
            return None, None
        if node == self.node_id:
            return None, rest
        return (node if node in self.peers else None), None
