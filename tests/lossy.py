"""A network namespace of its own whose loopback loses UDP datagrams, for lossy-network tests.

This kernel has no netem (`tc qdisc ... netem` fails: "Specified qdisc kind is unknown"), so loss
is made with nftables on the namespace's input hook (a drop on the output hook would fail the
sender's sendto with EPERM, which no network does). What nftables can emulate: random loss
(`numgen random mod 100 < 2`) and outages (drop every UDP datagram for a while, `outage` below).
What it cannot: delay, jitter, reordering, rate limits per flow; those need netem. `delay_datagrams`
stands in for netem's delay and jitter inside one process: every datagram an ICE agent of that
process sends leaves after delay ± jitter (uniform), so datagrams overtake each other as on a
jittery path. The lossy probe runs its server and peers in one process, so both directions see it.
Only UDP is dropped: media, RTCP, STUN, DTLS and SCTP (the DataChannel) all ride on it, while the
HTTP signaling (TCP) stays reliable, as it would on a real network with TCP retransmissions.

`udp_port_cut` instead drops one port's datagrams for good, in the caller's own namespace: a path
that never comes back, as after a network change, while the rest of the namespace is untouched.

Each namespace is created and deleted here (root and the `nftables` package needed), so rules
never touch another test's traffic. Under CI (CI=true) missing tools are a failure, else a skip.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
import random
import shutil
import subprocess
from collections.abc import Iterator
from typing import Any

from aioice.ice import StunProtocol

from .tools import unavailable

TABLE = "rtc_omni_lossy"
_names = itertools.count()


def require_nftables() -> None:
    """Skip (fail under CI) unless this process may create namespaces and load nftables rules."""
    missing = [tool for tool in ("ip", "nft") if shutil.which(tool) is None]
    if missing or os.geteuid() != 0:
        why = f"{', '.join(missing)} not installed (apt-get install iproute2 nftables)" if missing else "not root"
        unavailable(f"lossy-network tests need network namespaces and nftables: {why}")


def nft(namespace: str | None, script: str) -> None:
    """Run an nftables script inside `namespace` (None: this process's own)."""
    inside = ["ip", "netns", "exec", namespace] if namespace else []
    subprocess.run([*inside, "nft", "-f", "-"], input=script, text=True, check=True)


def set_random_loss(namespace: str, percent: int) -> None:
    """Drop `percent` % of the UDP datagrams received in `namespace`, at random (0: none)."""
    rule = f"add rule inet {TABLE} loss meta l4proto udp numgen random mod 100 < {percent} drop\n" if percent else ""
    nft(namespace, f"flush chain inet {TABLE} loss\n{rule}")


def outage(namespace: str, on: bool) -> None:
    """Start (or end) dropping every UDP datagram received in `namespace`: the network is gone."""
    rule = f"add rule inet {TABLE} outage meta l4proto udp drop\n" if on else ""
    nft(namespace, f"flush chain inet {TABLE} outage\n{rule}")


@contextlib.contextmanager
def lossy_namespace() -> Iterator[str]:
    """A fresh namespace with only `lo` (up) and empty `loss` and `outage` chains; yields its name."""
    require_nftables()
    name = f"rtc-omni-lossy-{os.getpid()}-{next(_names)}"
    subprocess.run(["ip", "netns", "add", name], check=True)
    try:
        subprocess.run(["ip", "netns", "exec", name, "ip", "link", "set", "lo", "up"], check=True)
        nft(
            name,
            f"add table inet {TABLE}\n"
            f"add chain inet {TABLE} loss {{ type filter hook input priority 0; }}\n"
            f"add chain inet {TABLE} outage {{ type filter hook input priority 1; }}\n",
        )
        yield name
    finally:
        subprocess.run(["ip", "netns", "delete", name], check=False)


@contextlib.contextmanager
def udp_port_cut(port: int) -> Iterator[None]:
    """Drop every UDP datagram to or from `port`, in this process's namespace, until the block ends:
    a network path gone for good (the old address after a Wi-Fi change), which ICE consent checks
    cannot heal. Only that port's traffic: the tests beside this one may share the namespace."""
    require_nftables()
    table = f"rtc_omni_cut_{os.getpid()}_{port}"
    nft(
        None,
        f"add table inet {table}\n"
        f"add chain inet {table} input {{ type filter hook input priority 0; }}\n"
        f"add rule inet {table} input udp dport {port} drop\n"
        f"add rule inet {table} input udp sport {port} drop\n",
    )
    try:
        yield
    finally:
        nft(None, f"delete table inet {table}\n")


class _DelayedTransport:
    """A datagram transport whose `sendto` hands each datagram to the real one after a random delay."""

    def __init__(self, transport: asyncio.DatagramTransport, delay_s: float, jitter_s: float) -> None:
        self._transport = transport
        self._delay_s, self._jitter_s = delay_s, jitter_s

    def sendto(self, data: bytes, addr: Any = None) -> None:
        delay = max(0.0, self._delay_s + random.uniform(-self._jitter_s, self._jitter_s))
        asyncio.get_running_loop().call_later(delay, self._send, data, addr)

    def _send(self, data: bytes, addr: Any) -> None:
        if not self._transport.is_closing():
            self._transport.sendto(data, addr)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)


def delay_datagrams(delay_s: float, jitter_s: float) -> None:
    """From now on, in this process, every ICE agent's datagram leaves after delay ± jitter."""
    made = StunProtocol.connection_made

    def connection_made(protocol: StunProtocol, transport: asyncio.BaseTransport) -> None:
        made(protocol, _DelayedTransport(transport, delay_s, jitter_s))  # type: ignore[arg-type]

    StunProtocol.connection_made = connection_made  # type: ignore[method-assign]
