"""aiortc private hook: a ceiling on the REMB estimates a video receiver sends.

aiortc's RTCRtpReceiver estimates the available bandwidth from the abs-send-time of each video
packet and reports it to the sender as REMB every 500 ms; nothing lets an application lower it.
The server asks senders for at most --max-video-bitrate (signaling/bitrate.py), so REMB must not
invite more: each REMB leaving through the receiver's private `_send_rtcp` is lowered to the
ceiling, the estimator itself untouched (lower estimates pass as they are). Remove when aiortc
lets an application bound its receive bitrate.
"""

from __future__ import annotations

from aiortc import RTCRtpReceiver
from aiortc.rtp import RTCP_PSFB_APP, AnyRtcpPacket, RtcpPsfbPacket, pack_remb_fci, unpack_remb_fci


def cap_remb(receiver: RTCRtpReceiver, max_bitrate: int) -> None:
    """Make every REMB `receiver` sends say at most `max_bitrate` bits per second."""
    send = receiver._send_rtcp

    async def send_capped(packet: AnyRtcpPacket) -> None:
        if isinstance(packet, RtcpPsfbPacket) and packet.fmt == RTCP_PSFB_APP and packet.fci.startswith(b"REMB"):
            bitrate, ssrcs = unpack_remb_fci(packet.fci)
            if bitrate > max_bitrate:
                packet.fci = pack_remb_fci(max_bitrate, ssrcs)
        await send(packet)

    receiver._send_rtcp = send_capped  # type: ignore[method-assign]
