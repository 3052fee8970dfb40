"""The public URL of a request behind a reverse proxy: the scheme and host its client used.

Every absolute URL the server writes (the `Location` of a realtime call, of WHIP and of WHEP) is built
from `request.url`. Behind a proxy that terminates TLS, that is the proxy's hop (`http://127.0.0.1:8080`),
so the middleware here replaces the request's scheme and host with those the proxy reports, in RFC 7239
`Forwarded` or else `X-Forwarded-Proto` / `X-Forwarded-Host`, but only on a request whose peer is one of
--trusted-proxy: anyone else could name any host, and a client would follow it.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Mapping, Sequence

from aiohttp import web
from aiohttp.typedefs import Handler, Middleware

Network = ipaddress.IPv4Network | ipaddress.IPv6Network
SCHEMES = ("http", "https")
# host, IPv4 or [IPv6], with an optional port: nothing that could end the URL's authority early
_HOST = re.compile(r"^(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9.-]+)(:\d{1,5})?$")


class TrustedProxies:
    """The addresses whose forwarded headers are believed (--trusted-proxy: addresses or CIDR networks)."""

    def __init__(self, entries: Sequence[str]) -> None:
        self.networks: list[Network] = [ipaddress.ip_network(entry, strict=False) for entry in entries]

    def __contains__(self, address: object) -> bool:
        """`address`: a peer address, or a `Forwarded` node (`1.2.3.4:80`, `[2001:db8::1]:80`, `unknown`)."""
        node = str(address)
        if node.startswith("["):
            host = node[1:].split("]", 1)[0]
        else:
            host = node.split(":", 1)[0] if node.count(":") == 1 else node  # IPv4 with a port, or IPv6
        try:
            ip = ipaddress.ip_address(host)
        except ValueError:
            return False
        if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:  # a proxy on IPv4, --host ::
            ip = ip.ipv4_mapped
        return any(ip in network for network in self.networks)


def _last(header: str | None) -> str | None:
    """The value the nearest proxy added to a comma-separated header."""
    return header.rsplit(",", 1)[-1].strip() if header else None


def _outermost_trusted(forwarded: Sequence[Mapping[str, str]], trusted: TrustedProxies) -> Mapping[str, str]:
    """The `Forwarded` element added by the proxy the client reached: walking back from the one the
    nearest proxy added, past each element whose `for` is itself a trusted proxy."""
    index = len(forwarded) - 1
    while index > 0 and forwarded[index].get("for") in trusted:
        index -= 1
    return forwarded[index]


def public_origin(request: web.BaseRequest, trusted: TrustedProxies) -> tuple[str, str]:
    """The scheme and host the request's client used: from a trusted proxy's headers, else its own."""
    scheme, host = request.scheme, request.host
    if request.remote not in trusted:
        return scheme, host
    element = _outermost_trusted(request.forwarded, trusted) if request.forwarded else {}
    proto = element.get("proto") or _last(request.headers.get("X-Forwarded-Proto"))
    named_host = element.get("host") or _last(request.headers.get("X-Forwarded-Host"))
    if proto is not None and proto.lower() in SCHEMES:
        scheme = proto.lower()
    if named_host is not None and _HOST.match(named_host):
        host = named_host
    return scheme, host


def public_url_middleware(trusted: TrustedProxies) -> Middleware:
    """Outer middleware: a request from a trusted proxy carries its client's scheme and host from here
    on, so `request.url` (and every URL built from it) is the one the client used."""

    @web.middleware
    async def restore_origin(request: web.Request, handler: Handler) -> web.StreamResponse:
        scheme, host = public_origin(request, trusted)
        if (scheme, host) == (request.scheme, request.host):
            return await handler(request)
        return await handler(request.clone(scheme=scheme, host=host))

    return restore_origin
