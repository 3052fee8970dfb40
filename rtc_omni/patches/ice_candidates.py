"""aioice patches: which addresses and ports ICE host candidates use, and consent for silent publishers.

aioice has no setting for any of the three, so each replaces one name inside `aioice.ice`:

- `get_host_addresses`: aioice gathers on every interface except loopback. A server must choose
  its own exposure (`--ice-address`), and tests must stay on 127.0.0.1. Remove when aioice takes a
  list of host addresses (or an interface filter) through aiortc's RTCConfiguration.
- `asyncio` (as aioice.ice sees it): aioice binds host sockets on ephemeral ports; `--ice-port-min`
  / `--ice-port-max` need a range for firewalls and containers. Only port-0 datagram binds change.
  Remove when aioice takes a port range (aioice issue #47 asks for a single-port mux).
- `Connection.close`: after six unanswered consent checks (RFC 7675, ~30 s) aioice closes the
  connection. FFmpeg's WHIP muxer answers no consent checks after setup, so its publisher would be
  dropped mid-stream; a connection whose owner says media still arrives gets a fresh consent loop
  instead. Remove when FFmpeg's WHIP muxer answers consent checks (its keep-alive is a TODO in
  libavformat/whip.c), or when aioice lets a caller veto consent expiry.
"""

from __future__ import annotations

import asyncio
import errno
import ipaddress
import logging
import weakref
from collections.abc import Callable, Sequence
from typing import Any

import aioice.ice
from aiortc import RTCPeerConnection

logger = logging.getLogger(__name__)

AIOICE_HOST_ADDRESSES: Callable[[bool, bool], list[str]] = aioice.ice.get_host_addresses
AIOICE_CLOSE = aioice.ice.Connection.close
_CONSENT_LOOP = aioice.ice.Connection.query_consent.__code__


class HostPolicy:
    """Where this process's ICE agents gather host candidates; set by patches.apply()."""

    addresses: list[ipaddress.IPv4Address | ipaddress.IPv6Address] | None = None  # None: aioice's choice
    ports: range | None = None  # None: ephemeral ports


def set_policy(addresses: Sequence[str] | None, ports: range | None) -> None:
    HostPolicy.addresses = None if addresses is None else [ipaddress.ip_address(a) for a in addresses]
    HostPolicy.ports = ports


def host_addresses(use_ipv4: bool, use_ipv6: bool) -> list[str]:
    """aioice.ice.get_host_addresses, limited to the configured addresses."""
    if HostPolicy.addresses is None:
        return AIOICE_HOST_ADDRESSES(use_ipv4, use_ipv6)
    return [str(a) for a in HostPolicy.addresses if (a.version == 4 and use_ipv4) or (a.version == 6 and use_ipv6)]


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


class AsyncioForAioice:
    """The `asyncio` module as aioice.ice sees it: get_running_loop() honours the port range."""

    def __getattr__(self, name: str) -> Any:
        return getattr(asyncio, name)

    def get_running_loop(self) -> asyncio.AbstractEventLoop | _PortRangeLoop:
        loop = asyncio.get_running_loop()
        return loop if HostPolicy.ports is None else _PortRangeLoop(loop, HostPolicy.ports)


# Both sides weak: the keeper is a method of the peer that owns the connection, and must not keep it alive.
_consent_keepers: weakref.WeakKeyDictionary[aioice.ice.Connection, weakref.WeakMethod[Callable[[], bool]]] = (
    weakref.WeakKeyDictionary()
)


async def close_unless_media_arrives(connection: aioice.ice.Connection) -> None:
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
    await AIOICE_CLOSE(connection)


def keep_consent_while(pc: RTCPeerConnection, media_arriving: Callable[[], bool]) -> None:
    """Do not let unanswered ICE consent checks end `pc` while `media_arriving()` is true.

    For peers that answer no consent checks after setup (FFmpeg's WHIP muxer); the caller must end
    the connection itself once media stops. Call after the answer is made (the transports exist).
    `media_arriving` is a bound method, held weakly.
    """
    for transceiver in pc.getTransceivers():
        ice_transport = transceiver.receiver.transport.transport
        _consent_keepers[ice_transport._connection] = weakref.WeakMethod(media_arriving)  # aiortc has no getter


def install() -> None:
    aioice.ice.get_host_addresses = host_addresses  # type: ignore[assignment]
    aioice.ice.asyncio = AsyncioForAioice()  # type: ignore[assignment]
    aioice.ice.Connection.close = close_unless_media_arrives  # type: ignore[method-assign, assignment]
