"""Every change rtc-omni makes to aiortc and aioice, in one package, installed once at start-up.

aiortc and aioice give no hook for what these do, so each patch replaces or reads one private
name. Each module says why its patch exists, what it relies on and when to remove it;
tests/test_patches.py fails loudly when an aiortc or aioice release changes any of that.

| module | library | what |
|---|---|---|
| ice_candidates.py | aioice | host candidates on the set addresses and ports; consent kept for FFmpeg's WHIP muxer |
| sctp.py | aiortc | SCTP out-of-order state bounded, receive window enforced |
| datachannel_receive.py | aiortc | a bad DataChannel message (not UTF-8, a contradicting DCEP open or ack) is dropped |
| jitter.py | aiortc | a video frame released on its RTP marker bit; each audio packet as it arrives (per receiver) |
| codecs.py | aiortc | read a transceiver's negotiated codecs (no public getter) |
| keyframes.py | aiortc | a viewer's PLI/FIR reaches the shared encoder (per sender) |
| remb.py | aiortc | a ceiling on the REMB a video receiver sends (per receiver) |
| decoding.py | aiortc | decoded frames handed over without a task each; mics decoded on the loop, 16 kHz, gaps silent |

`apply()` runs at start-up: in `create_app` (the server), at the CLI's client and bench entry,
and in the tests' conftest. Never from a constructor: the ICE policy is process-wide.
"""

from __future__ import annotations

from collections.abc import Sequence

from . import datachannel_receive, decoding, ice_candidates, sctp

LOOPBACK = ("127.0.0.1",)

_installed = False


def apply(ice_addresses: Sequence[str] | None = LOOPBACK, ice_ports: range | None = None) -> None:
    """Install the process-wide patches (once), and set where ICE gathers host candidates.

    `ice_addresses` None means aioice's own choice (every interface but loopback); `ice_ports`
    None means ephemeral ports.
    """
    global _installed
    if not _installed:
        ice_candidates.install()
        sctp.install()
        datachannel_receive.install()
        decoding.install()
        _installed = True
    ice_candidates.set_policy(ice_addresses, ice_ports)
