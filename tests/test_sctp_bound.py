"""The SCTP receive bound (rtc_omni/patches/sctp.py), on aiortc's RTCSctpTransport driven in memory.

A hostile peer leaves one TSN out and sends thousands of tiny DATA chunks after it: aiortc kept all
of them and re-sorted them for every new one (quadratic CPU). With the patch the receiver holds at
most MAX_TSN_AHEAD of them and never reports more; a real sender then retransmits the rest, and
every message arrives, in order, once the gap is filled. Its receive window is enforced too.
"""

from __future__ import annotations

from aiortc.rtcsctptransport import SackChunk, parse_packet

from rtc_omni.patches.sctp import MAX_TSN_AHEAD

from .sctp_memory import FIRST_TSN, MemoryDtls, chunk, receiver, send


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
