"""aiortc patches: release each received video frame as soon as it is complete, not when the next one
begins; and each audio packet as it arrives.

aiortc's video jitter buffer hands a frame to the decoder only when a packet of the *next* frame
arrives, so every camera frame waits one frame interval (33 ms at 30 fps) before ingest sees it.
The RTP marker bit ends a frame (VP8, H.264), so a run of contiguous packets of one timestamp that
ends with it is complete; this buffer releases it then. Without a marker (lost, or a sender that
does not set it) aiortc's rule still applies.

Relies on: RTCRtpReceiver's name-mangled `__jitter_buffer` (replaced per receiver, aiortc has no
setter), and JitterBuffer's `_remove_frame`, `_origin`, `_packets`, `remove` and RtpPacket's `_data`.
Remove when aiortc releases a frame on its marker bit (no upstream issue yet).

Audio: aiortc's audio buffer holds each packet until four more have arrived (`prefetch=4`): 80 ms
at 20 ms packets, 240 ms at the 60 ms a browser sends when asked (signaling/ptime.py), 480 ms at
the talker's 120 ms, and the end of a talkspurt waits there until the next one starts. Without
prefetch a packet still waits for the next one; and one lost packet stalls the buffer until it
overflows, after which it releases one packet per arrival, 14 behind for the rest of the stream
(0.84 s of a 60 ms mic). Its consumers here (server ingest, which buffers the mic anyway; the
headless client's recorder) need no playout cushion, and audio is not retransmitted, so
`ArrivalAudioBuffer` releases each packet as it arrives: a gap is a loss, a packet older than one
already released is dropped (a duplicate, or reordered), and one far from the stream (more than
aiortc's MAX_MISORDER behind) restarts it, as aiortc's buffer does. Relies on the same
`__jitter_buffer`, on `add` being all the receiver calls, and on RtpPacket's `_data`; remove when
aiortc's receiver takes a prefetch setting and skips lost audio.
"""

from __future__ import annotations

from aiortc import RTCPeerConnection
from aiortc.jitterbuffer import MAX_MISORDER, JitterBuffer, JitterFrame
from aiortc.rtp import RtpPacket
from aiortc.utils import uint16_add

VIDEO_CAPACITY = 512  # aiortc's own for video
AUDIO_CAPACITY = 16  # aiortc's own for audio


class MarkerJitterBuffer(JitterBuffer):
    def __init__(self) -> None:
        super().__init__(capacity=VIDEO_CAPACITY, is_video=True)

    def _remove_frame(self, sequence_number: int) -> JitterFrame | None:
        complete = self._complete_head()
        return complete if complete is not None else super()._remove_frame(sequence_number)

    def _complete_head(self) -> JitterFrame | None:
        if self._origin is None:
            return None
        packets: list[RtpPacket] = []
        for count in range(self.capacity):
            packet = self._packets[(self._origin + count) % self.capacity]
            if packet is None or (packets and packet.timestamp != packets[0].timestamp):
                return None
            packets.append(packet)
            if packet.marker:
                self.remove(count + 1)
                return JitterFrame(data=b"".join(p._data for p in packets), timestamp=packet.timestamp)  # type: ignore[attr-defined]
        return None


def release_frames_when_complete(pc: RTCPeerConnection) -> None:
    """Give every video receiver of `pc` the marker-aware buffer; call before media flows
    (after setRemoteDescription, before the answer)."""
    for transceiver in pc.getTransceivers():
        if transceiver.kind == "video":
            transceiver.receiver._RTCRtpReceiver__jitter_buffer = MarkerJitterBuffer()  # type: ignore[attr-defined]


class ArrivalAudioBuffer(JitterBuffer):
    """Releases each audio packet as it arrives, in sequence order; never holds one."""

    def __init__(self) -> None:
        super().__init__(capacity=AUDIO_CAPACITY)

    def add(self, packet: RtpPacket) -> tuple[bool, JitterFrame | None]:
        if self._origin is not None and 0 < uint16_add(self._origin, -packet.sequence_number) <= MAX_MISORDER:
            return False, None  # its place in the stream was already played past
        self._origin = uint16_add(packet.sequence_number, 1)  # the next one expected
        return False, JitterFrame(data=packet._data, timestamp=packet.timestamp)  # type: ignore[attr-defined]


def release_audio_on_arrival(pc: RTCPeerConnection) -> None:
    """Give every audio receiver of `pc` an ArrivalAudioBuffer; call before media flows."""
    for transceiver in pc.getTransceivers():
        if transceiver.kind == "audio":
            transceiver.receiver._RTCRtpReceiver__jitter_buffer = ArrivalAudioBuffer()  # type: ignore[attr-defined]
