"""The SCTP receive bound (rtc_omni/patches/sctp.py), on aiortc's RTCSctpTransport driven in memory.

A hostile peer leaves one TSN out and sends thousands of tiny DATA chunks after it: aiortc kept all
of them and re-sorted them for every new one (quadratic CPU). With the patch the receiver holds at
most MAX_TSN_AHEAD of them and never reports more; a real sender then retransmits the rest, and
every message arrives, in order, once the gap is filled. Its receive window is enforced too.
"""

from __future__ import annotations

from typing import Any

from aiortc.rtcsctptransport import (
    SCTP_DATA_FIRST_FRAG,
    SCTP_DATA_LAST_FRAG,
    DataChunk,
    RTCSctpTransport,
    SackChunk,
    parse_packet,
    serialize_packet,
)

from rtc_omni.patches.sctp import MAX_TSN_AHEAD

PORT = 5000
FIRST_TSN = 1000
WEBRTC_BINARY = 53


class MemoryDtls:
    """Just enough of an RTCDtlsTransport for a receiving association: it records what is sent."""

    state = "connected"

    def __init__(self) -> None:
        self.sent: list[bytes] = []

    def _register_data_receiver(self, receiver: Any) -> None:
        pass

    async def _send_data(self, data: bytes) -> None:
        self.sent.append(data)


def receiver() -> tuple[RTCSctpTransport, MemoryDtls, list[bytes]]:
    """An association as established after the handshake, with the peer's first TSN FIRST_TSN."""
    dtls = MemoryDtls()
    sctp = RTCSctpTransport(dtls)  # type: ignore[arg-type]
    sctp._remote_port = PORT
    sctp._last_received_tsn = FIRST_TSN - 1
    delivered: list[bytes] = []

    async def deliver(stream_id: int, pp_id: int, data: bytes) -> None:
        delivered.append(data)

    sctp._receive = deliver  # type: ignore[method-assign]
    return sctp, dtls, delivered


def chunk(tsn: int, stream_seq: int, data: bytes) -> DataChunk:
    c = DataChunk(flags=SCTP_DATA_FIRST_FRAG | SCTP_DATA_LAST_FRAG)
    c.tsn, c.stream_id, c.stream_seq, c.protocol, c.user_data = tsn, 1, stream_seq, WEBRTC_BINARY, data
    return c


async def send(sctp: RTCSctpTransport, c: DataChunk) -> None:
    """One DATA chunk in one packet, through aiortc's own packet parser (a SACK follows)."""
    await sctp._handle_data(serialize_packet(PORT, PORT, sctp._local_verification_tag, c))


def last_sack(dtls: MemoryDtls) -> SackChunk:
    _, _, _, chunks = parse_packet(dtls.sent[-1])
    assert isinstance(chunks[0], SackChunk)
    return chunks[0]


async def test_chunks_after_a_missing_tsn_are_held_up_to_the_bound_and_none_is_lost() -> None:
    sctp, dtls, delivered = receiver()
    count = 3 * MAX_TSN_AHEAD
    messages = [i.to_bytes(2, "big") for i in range(count)]
    for i in range(1, count):  # message 0 is "lost"
        await send(sctp, chunk(FIRST_TSN + i, i, messages[i]))

    assert len(sctp._sack_misordered) <= MAX_TSN_AHEAD  # aiortc alone held all 3071
    sack = last_sack(dtls)
    assert sack.cumulative_tsn == FIRST_TSN - 1
    assert max(end for _, end in sack.gaps) <= MAX_TSN_AHEAD  # nothing beyond it acknowledged
    assert delivered == []

    # The sender retransmits what was never acknowledged, from the missing TSN on.
    for i in range(count):
        await send(sctp, chunk(FIRST_TSN + i, i, messages[i]))
    assert delivered == messages  # every message, in order
    assert last_sack(dtls).cumulative_tsn == FIRST_TSN + count - 1 and not sctp._sack_misordered


async def test_the_receive_window_is_enforced_for_messages_that_cannot_be_delivered() -> None:
    sctp, dtls, delivered = receiver()
    window = sctp._advertised_rwnd
    payload = bytes(1000)
    # An ordered stream whose first message never comes: nothing can be delivered, all is held.
    for i in range(window // len(payload) + 100):
        await send(sctp, chunk(FIRST_TSN + i, i + 1, payload))

    held = sum(len(c.user_data) for stream in sctp._inbound_streams.values() for c in stream.reassembly)
    assert held <= window  # aiortc alone held 100 KB more than it advertised
    assert last_sack(dtls).advertised_rwnd < len(payload)
    assert delivered == []
