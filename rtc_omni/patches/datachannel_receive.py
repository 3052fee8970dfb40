"""aiortc patch: a bad DataChannel message is one bad message, not a dead connection.

aiortc decodes a WebRTC String message (PPID 51) with `data.decode("utf8")` inside
`RTCSctpTransport._data_channel_receive`, on the receive loop of the DTLS transport. One invalid
byte raises UnicodeDecodeError out of that loop: the DTLS transport closes, and with it the
association, every DataChannel and every track, with nothing to tell the application why (the
server dropped the session, a 404, while the client still read "connected"). The same decode
reads a DATA_CHANNEL_OPEN's label and protocol.

The patch catches the UnicodeDecodeError there. A text message is dropped, logged, and its channel
emits NOT_UTF8 (with the message's size) in place of "message", so the session answers with an
`error`; a channel open is dropped and logged (that channel never opens). The association goes on.

The same loop asserts on two DCEP messages a peer may send: a DATA_CHANNEL_OPEN for a stream that
already has a channel, and a DATA_CHANNEL_ACK for a stream that has none (and, under `python -O`,
the ACK raises KeyError instead). Both are dropped and logged before aiortc sees them.

Relies on RTCSctpTransport's `_data_channel_receive(stream_id, pp_id, data)` decoding there
before it emits anything, and on its `_data_channels` by stream id. Remove when aiortc delivers
or drops such messages itself (the report for upstream is docs/upstream-datachannel-text.md).
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable

from aiortc.rtcsctptransport import DATA_CHANNEL_ACK, DATA_CHANNEL_OPEN, WEBRTC_DCEP, WEBRTC_STRING, RTCSctpTransport

logger = logging.getLogger(__name__)

NOT_UTF8 = "not-utf8"  # the channel's event, with the dropped message's size in bytes

AIORTC_DATA_CHANNEL_RECEIVE: Callable[[RTCSctpTransport, int, int, bytes], Awaitable[None]] = (
    RTCSctpTransport._data_channel_receive
)


async def data_channel_receive_checked(sctp: RTCSctpTransport, stream_id: int, pp_id: int, data: bytes) -> None:
    """RTCSctpTransport._data_channel_receive, with a message that does not decode, or a DCEP message
    that contradicts the channels open, dropped instead of ending the transport's receive loop."""
    if pp_id == WEBRTC_DCEP and data and _contradicts(sctp, stream_id, data[0]):
        logger.warning("dropping a DCEP message (type %d) on stream %d: no such channel change", data[0], stream_id)
        return
    try:
        await AIORTC_DATA_CHANNEL_RECEIVE(sctp, stream_id, pp_id, data)
    except UnicodeDecodeError as exc:
        channel = sctp._data_channels.get(stream_id) if pp_id == WEBRTC_STRING else None
        what = "text message" if channel is not None else f"message (PPID {pp_id}) on stream {stream_id}"
        logger.warning("dropping a %d-byte DataChannel %s: not UTF-8 (%s)", len(data), what, exc.reason)
        if channel is not None:
            channel.emit(NOT_UTF8, len(data))


def _contradicts(sctp: RTCSctpTransport, stream_id: int, msg_type: int) -> bool:
    """An open for a stream already open, or an ack for a stream never opened."""
    open_already = stream_id in sctp._data_channels
    return (msg_type == DATA_CHANNEL_OPEN and open_already) or (msg_type == DATA_CHANNEL_ACK and not open_already)


def install() -> None:
    RTCSctpTransport._data_channel_receive = data_channel_receive_checked  # type: ignore[method-assign, assignment]
