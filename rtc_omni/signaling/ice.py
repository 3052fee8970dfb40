"""ICE policy: which local addresses the server's ICE agents use and which STUN/TURN servers.

aioice gathers host candidates on every interface except loopback, and aiortc falls back to a
public STUN server when given no ICE server list. Both are wrong for a server that must choose
its own exposure, so this module is the one place that decides: the host addresses come from
settings (`--ice-address`, loopback by default) through one contained replacement of aioice's
address lookup, host sockets bind inside `--ice-port-min..--ice-port-max` when set (aioice binds
ephemeral ports), and the ICE server list is always explicit (empty unless configured). It also
mints TURN REST credentials from coturn's shared secret, writes the ICE servers as WHIP `Link`
headers, advertises configured public addresses first in every answer, and keeps ICE consent
for a peer that never answers consent checks while its media keeps arriving (FFmpeg's WHIP muxer).
"""

from __future__ import annotations

import asyncio
import base64
import errno
import hashlib
import hmac
import ipaddress
import logging
import time
import weakref
from collections.abc import Callable, Sequence
from typing import Any

import aioice.ice
from aiohttp import web
from aiortc import RTCConfiguration, RTCIceCandidate, RTCIceServer, RTCIceTransportPolicy, RTCPeerConnection
from aiortc.sdp import SessionDescription

from ..config import Settings
from ..sessions.registry import new_session_id
from .keys import SETTINGS

logger = logging.getLogger(__name__)

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


class _PortRangeLoop:
    """The running loop as aioice.ice sees it: port-0 datagram binds land inside `ports`.

    aioice.ice binds only its host candidates' sockets itself (Connection.get_component_candidates,
    `local_addr=(address, 0)`); everything else is passed straight to the real loop.
    """

    _next = 0  # shared cursor, so consecutive binds do not all probe from the bottom of the range

    def __init__(self, loop: asyncio.AbstractEventLoop, ports: range) -> None:
        self._loop = loop
        self._ports = ports

    def __getattr__(self, name: str) -> Any:
        return getattr(self._loop, name)

    async def create_datagram_endpoint(self, factory: Any, local_addr: Any = None, **kwargs: Any) -> Any:
        if local_addr is None or local_addr[1] != 0:
            return await self._loop.create_datagram_endpoint(factory, local_addr=local_addr, **kwargs)
        for _attempt in range(len(self._ports)):
            port = self._ports[_PortRangeLoop._next % len(self._ports)]
            _PortRangeLoop._next += 1
            try:
                return await self._loop.create_datagram_endpoint(factory, local_addr=(local_addr[0], port), **kwargs)
            except OSError as exc:
                if exc.errno != errno.EADDRINUSE:
                    raise
        raise OSError(errno.EADDRINUSE, f"no free UDP port in {self._ports.start}-{self._ports.stop - 1}")


class _AsyncioForAioice:
    """The `asyncio` module as aioice.ice sees it, with get_running_loop() bound to a port range."""

    def __init__(self, ports: range) -> None:
        self._ports = ports

    def __getattr__(self, name: str) -> Any:
        return getattr(asyncio, name)

    def get_running_loop(self) -> _PortRangeLoop:
        return _PortRangeLoop(asyncio.get_running_loop(), self._ports)


def set_port_range(ports: range | None) -> None:
    """Bind ICE host candidates inside `ports`; None restores aioice's ephemeral ports.

    Process-wide, like set_host_addresses: only aioice.ice's view of asyncio changes.
    """
    aioice.ice.asyncio = asyncio if ports is None else _AsyncioForAioice(ports)  # type: ignore[assignment]


_AIOICE_CLOSE = aioice.ice.Connection.close
_CONSENT_LOOP = aioice.ice.Connection.query_consent.__code__
# Both sides weak: the keeper is a method of the peer that owns the connection, and must not keep it alive.
_consent_keepers: weakref.WeakKeyDictionary[aioice.ice.Connection, weakref.WeakMethod[Callable[[], bool]]] = (
    weakref.WeakKeyDictionary()
)


async def _close_unless_media_arrives(connection: aioice.ice.Connection) -> None:
    """aioice.Connection.close, except when aioice's own consent loop calls it on expiry (RFC 7675)
    for a connection whose keeper says media is still arriving: then a fresh consent loop starts."""
    task = asyncio.current_task()
    expiring = task is not None and getattr(task.get_coro(), "cr_code", None) is _CONSENT_LOOP
    keeper_ref = _consent_keepers.get(connection)
    keeper = keeper_ref() if keeper_ref is not None else None
    if expiring and keeper is not None and keeper():
        logger.info("ICE consent checks unanswered, but media keeps arriving: connection kept")
        connection._query_consent_task = asyncio.create_task(connection.query_consent())
        return
    await _AIOICE_CLOSE(connection)


def keep_consent_while(pc: RTCPeerConnection, media_arriving: Callable[[], bool]) -> None:
    """Do not let unanswered ICE consent checks end `pc` while `media_arriving()` is true.

    For peers that answer no consent checks after setup (FFmpeg's WHIP muxer); the caller must end
    the connection itself once media stops. Call after the answer is made (the transports exist).
    `media_arriving` is a bound method, held weakly.
    """
    aioice.ice.Connection.close = _close_unless_media_arrives  # type: ignore[method-assign, assignment]
    for transceiver in pc.getTransceivers():
        ice_transport = transceiver.receiver.transport.transport
        _consent_keepers[ice_transport._connection] = weakref.WeakMethod(media_arriving)  # aiortc has no getter


def ice_servers(urls: Sequence[str], username: str | None = None, credential: str | None = None) -> list[RTCIceServer]:
    """RTCIceServer objects for the configured URLs; TURN URLs get the credentials."""
    servers = []
    for url in urls:
        if url.startswith(("turn:", "turns:")):
            servers.append(RTCIceServer(urls=url, username=username, credential=credential))
        else:
            servers.append(RTCIceServer(urls=url))
    return servers


def rtc_configuration(servers: list[RTCIceServer], relay_only: bool = False) -> RTCConfiguration:
    """A configuration that never falls back to aiortc's default public STUN server."""
    policy = RTCIceTransportPolicy.RELAY if relay_only else RTCIceTransportPolicy.ALL
    return RTCConfiguration(iceServers=list(servers), iceTransportPolicy=policy)


def turn_rest_credentials(secret: str, name: str, ttl: int, now: float | None = None) -> tuple[str, str]:
    """coturn's TURN REST scheme: username "expiry:name", password base64(HMAC-SHA1(secret, username))."""
    expiry = int((time.time() if now is None else now) + ttl)
    username = f"{expiry}:{name}"
    digest = hmac.new(secret.encode(), username.encode(), hashlib.sha1).digest()
    return username, base64.b64encode(digest).decode("ascii")


def configured_ice_servers(settings: Settings, name: str = "rtc-omni") -> list[RTCIceServer]:
    """The configured STUN/TURN servers; with --turn-secret, TURN gets fresh ephemeral credentials."""
    if settings.turn_secret:
        username, credential = turn_rest_credentials(settings.turn_secret, name, settings.turn_ttl)
        return ice_servers(settings.ice_server, username, credential)
    return ice_servers(settings.ice_server, settings.ice_username, settings.ice_credential)


def ice_server_json(server: RTCIceServer) -> dict[str, object]:
    """One entry of a browser's RTCConfiguration.iceServers."""
    entry: dict[str, object] = {"urls": [server.urls] if isinstance(server.urls, str) else list(server.urls)}
    if server.username is not None:
        entry.update(username=server.username, credential=server.credential)
    return entry


async def get_ice_servers(request: web.Request) -> web.Response:
    """`GET /v1/ice-servers`: what a browser passes as RTCConfiguration.iceServers.

    Each call mints fresh TURN REST credentials under a random name, valid for --turn-ttl seconds.
    """
    settings = request.app[SETTINGS]
    servers = configured_ice_servers(settings, new_session_id())
    ttl = settings.turn_ttl if settings.turn_secret else None
    return web.json_response({"iceServers": [ice_server_json(s) for s in servers], "ttl": ttl})


def link_headers(servers: Sequence[RTCIceServer]) -> list[str]:
    """WHIP (RFC 9725 section 4.6) `Link: <url>; rel="ice-server"` values, as OBS reads them."""
    links = []
    for server in servers:
        for url in [server.urls] if isinstance(server.urls, str) else server.urls:
            link = f'<{url}>; rel="ice-server"'
            if server.username is not None:
                link += f'; username="{server.username}"; credential="{server.credential}"; credential-type="password"'
            links.append(link)
    return links


def advertise_public_addresses(sdp: str, addresses: Sequence[str]) -> str:
    """Put a host candidate for each public address first in every media section of an answer.

    Behind 1:1 NAT the public address forwards to the same port on the private one, so each
    public candidate reuses the port of the first gathered UDP host candidate. It also becomes
    the connection address, and gets a higher priority than anything gathered.
    """
    if not addresses:
        return sdp
    description = SessionDescription.parse(sdp)
    for media in description.media:
        first = next((c for c in media.ice_candidates if c.type == "host" and c.protocol.lower() == "udp"), None)
        if first is None:
            continue
        public = [
            RTCIceCandidate(
                component=first.component,
                foundation=f"public{index}",
                ip=address,
                port=first.port,
                priority=first.priority + len(addresses) - index,
                protocol="udp",
                type="host",
            )
            for index, address in enumerate(addresses)
        ]
        media.ice_candidates[:0] = public
        media.host = addresses[0]
    return str(description)
