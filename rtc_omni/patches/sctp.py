"""aiortc patch: bound the SCTP receiver's out-of-order state and enforce its receive window.

aiortc's RTCSctpTransport keeps every DATA chunk that arrives after a missing TSN, and for each
new one sorts and filters all it keeps (`_mark_received`, `_send_sack`). After one missing TSN, a
peer sending 1-byte chunks costs quadratic CPU: 12,000 chunks took 7 s, against 0.6 s in order.
aiortc also advertises a 1 MiB receive window but never enforces it, so chunks held for
reassembly (an ordered stream whose next message never comes) grow without bound.

The patch drops a new DATA chunk before aiortc sees it when
- its TSN lies more than MAX_TSN_AHEAD past the cumulative TSN, or
- the receive window is used up and its TSN lies past the highest TSN received (RFC 9260 6.2).
A dropped chunk is neither acknowledged nor reported in a gap, so a real sender retransmits it
once the window moves (the SACKs of the chunks it holds tell it the window); a packet of dropped
chunks alone gets no SACK, so flooding costs the receiver no more than the drop. A chunk that
fills a gap is always taken, so the association cannot deadlock on its own window.

Relies on RTCSctpTransport's `_receive_data_chunk`, `_last_received_tsn`, `_sack_misordered`,
and `_advertised_rwnd`. Remove when aiortc bounds both itself (the proposal for
upstream is docs/upstream-sctp.md).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from aiortc.rtcsctptransport import SCTP_TSN_MODULO, DataChunk, RTCSctpTransport

# 1024 chunks of aiortc's 1200-byte maximum fill the 1 MiB window, so a sender of full chunks is
# never held back more than the window already holds it; a sender of tiny chunks is, which is the point.
MAX_TSN_AHEAD = 1024

AIORTC_RECEIVE_DATA_CHUNK: Callable[[RTCSctpTransport, DataChunk], Awaitable[None]] = (
    RTCSctpTransport._receive_data_chunk
)


def _distance(tsn: int, base: int) -> int:
    """How far `tsn` lies past `base`, in serial number arithmetic (0 or more than 2**31: not past)."""
    return (tsn - base) % SCTP_TSN_MODULO


def refuses(sctp: RTCSctpTransport, chunk: DataChunk) -> bool:
    """Whether this new DATA chunk falls outside what the receiver agrees to hold."""
    cumulative = sctp._last_received_tsn
    if cumulative is None:
        return False
    ahead = _distance(chunk.tsn, cumulative)
    if ahead == 0 or ahead >= SCTP_TSN_MODULO // 2:
        return False  # a duplicate: aiortc reports it
    if ahead > MAX_TSN_AHEAD:
        return True
    if sctp._advertised_rwnd - len(chunk.user_data) >= 0:
        return False
    highest = max((_distance(t, cumulative) for t in sctp._sack_misordered), default=0)
    return ahead > highest


async def receive_data_chunk_bounded(sctp: RTCSctpTransport, chunk: DataChunk) -> None:
    """RTCSctpTransport._receive_data_chunk, for the chunks the receiver agrees to hold."""
    if refuses(sctp, chunk):
        return
    await AIORTC_RECEIVE_DATA_CHUNK(sctp, chunk)


def install() -> None:
    RTCSctpTransport._receive_data_chunk = receive_data_chunk_bounded  # type: ignore[method-assign, assignment]
