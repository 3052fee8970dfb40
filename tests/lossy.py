"""A network namespace of its own whose loopback loses UDP datagrams, for lossy-network tests.

This kernel has no netem (`tc qdisc ... netem` fails: "Specified qdisc kind is unknown"), so loss
is made with nftables on the namespace's input hook (a drop on the output hook would fail the
sender's sendto with EPERM, which no network does). What nftables can emulate: random loss
(`numgen random mod 100 < 2`) and outages (drop every UDP datagram for a while, `outage` below).
What it cannot: delay, jitter, reordering, rate limits per flow; those need netem or a UDP relay.
Only UDP is dropped: media, RTCP, STUN, DTLS and SCTP (the DataChannel) all ride on it, while the
HTTP signaling (TCP) stays reliable, as it would on a real network with TCP retransmissions.

Each namespace is created and deleted here (root and the `nftables` package needed), so rules
never touch another test's traffic. Under CI (CI=true) missing tools are a failure, else a skip.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import shutil
import subprocess
from collections.abc import Iterator

from .tools import unavailable

TABLE = "rtc_omni_lossy"
_names = itertools.count()


def require_nftables() -> None:
    """Skip (fail under CI) unless this process may create namespaces and load nftables rules."""
    missing = [tool for tool in ("ip", "nft") if shutil.which(tool) is None]
    if missing or os.geteuid() != 0:
        why = f"{', '.join(missing)} not installed (apt-get install iproute2 nftables)" if missing else "not root"
        unavailable(f"lossy-network tests need network namespaces and nftables: {why}")


def nft(namespace: str, script: str) -> None:
    """Run an nftables script inside `namespace`."""
    subprocess.run(["ip", "netns", "exec", namespace, "nft", "-f", "-"], input=script, text=True, check=True)


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
