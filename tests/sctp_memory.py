"""An aiortc SCTP association driven in memory, as after its handshake: DATA chunks in, SACKs recorded.

For the SCTP receive bound's tests and its CPU benchmark (benchmarks/sctp_reorder.py)."""

from __future__ import annotations

from typing import Any

from aiortc.rtcsctptransport import (
    SCTP_DATA_FIRST_FRAG,
    SCTP_DATA_LAST_FRAG,
    DataChunk,
    RTCSctpTransport,
    serialize_packet,
)

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
