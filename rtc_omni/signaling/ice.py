"""ICE policy: which STUN/TURN servers the server's ICE agents use, and what clients are told.

aiortc falls back to a public STUN server when given no ICE server list, which is wrong for a
server that must choose its own exposure, so the list here is always explicit (empty unless
configured). This module also mints TURN REST credentials from coturn's shared secret, writes the
ICE servers as WHIP `Link` headers, and advertises configured public addresses first in every
answer. Which local addresses and ports host candidates use is set through rtc_omni.patches
(`--ice-address`, `--ice-port-min/max`), since aioice has no setting for either.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import time
from collections.abc import Sequence

from aiohttp import web
from aiortc import RTCConfiguration, RTCIceCandidate, RTCIceServer, RTCIceTransportPolicy
from aiortc.sdp import SessionDescription

from ..config import Settings
from ..sessions.registry import new_session_id
from .keys import SETTINGS


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
    `ice_loopback_only` tells the page that a browser on another machine cannot connect at all
    until the server gathers elsewhere (--ice-address), which no TURN server changes.
    """
    settings = request.app[SETTINGS]
    servers = configured_ice_servers(settings, new_session_id())
    ttl = settings.turn_ttl if settings.turn_secret else None
    body = {"iceServers": [ice_server_json(s) for s in servers], "ttl": ttl}
    return web.json_response({**body, "ice_loopback_only": settings.ice_loopback_only})


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
