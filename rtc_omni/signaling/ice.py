"""ICE policy: which local addresses the server's ICE agents use and which STUN/TURN servers.

aioice gathers host candidates on every interface except loopback, and aiortc falls back to a
public STUN server when given no ICE server list. Both are wrong for a server that must choose
its own exposure, so this module is the one place that decides: the host addresses come from
settings (`--ice-address`, loopback by default) through one contained replacement of aioice's
address lookup, and the ICE server list is always explicit (empty unless configured).
"""

from __future__ import annotations

import ipaddress
from collections.abc import Callable, Sequence

import aioice.ice
from aiortc import RTCConfiguration, RTCIceServer

_AIOICE_DEFAULT: Callable[[bool, bool], list[str]] = aioice.ice.get_host_addresses


def set_host_addresses(addresses: Sequence[str] | None) -> None:
    """Gather host candidates only on `addresses`; None restores aioice's own choice.

    Process-wide: every RTCPeerConnection created afterwards in this process follows it.
    """
    if addresses is None:
        aioice.ice.get_host_addresses = _AIOICE_DEFAULT  # type: ignore[assignment]
        return
    parsed = [ipaddress.ip_address(a) for a in addresses]

    def configured_addresses(use_ipv4: bool, use_ipv6: bool) -> list[str]:
        return [str(a) for a in parsed if (a.version == 4 and use_ipv4) or (a.version == 6 and use_ipv6)]

    aioice.ice.get_host_addresses = configured_addresses  # type: ignore[assignment]


def ice_servers(urls: Sequence[str], username: str | None = None, credential: str | None = None) -> list[RTCIceServer]:
    """RTCIceServer objects for the configured URLs; TURN URLs get the credentials."""
    servers = []
    for url in urls:
        if url.startswith(("turn:", "turns:")):
            servers.append(RTCIceServer(urls=url, username=username, credential=credential))
        else:
            servers.append(RTCIceServer(urls=url))
    return servers


def rtc_configuration(servers: list[RTCIceServer]) -> RTCConfiguration:
    """A configuration that never falls back to aiortc's default public STUN server."""
    return RTCConfiguration(iceServers=list(servers))
