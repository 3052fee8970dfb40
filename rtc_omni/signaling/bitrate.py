"""The camera bitrate the server asks of senders: `b=AS` in its answers and a ceiling on its REMB.

Frame rate is the cost that matters (the server decodes every frame to sample a few, media/ingest.py),
but only the senders we write can be told a frame rate (maxFramerate: static/js/talk.js,
client/rtc_peers.py). Every other sender can only be asked for a bitrate, two ways: `b=AS` on the video
m-line of the answer (RFC 4566: what the answerer wants to receive; Chromium and Firefox honour it),
and REMB feedback (Chromium and aiortc senders honour it). At a low enough bitrate Chromium lowers
the frame rate too. FFmpeg, GStreamer and OBS publishers ignore both and send what they are set to
(docs/whip.md, "Bitrate").
"""

from __future__ import annotations

from aiortc import RTCPeerConnection

from ..patches.remb import cap_remb

RECEIVING = ("a=recvonly", "a=sendrecv")  # the answer's direction when the server receives on the m-line


def limit_video_bitrate(pc: RTCPeerConnection, answer_sdp: str, kbps: int) -> str:
    """Cap the REMB of `pc`'s video receivers at `kbps` and return `answer_sdp` asking for it by b=AS.

    `kbps` 0 leaves both alone. Call after setRemoteDescription (the receivers exist then).
    """
    if kbps <= 0:
        return answer_sdp
    for transceiver in pc.getTransceivers():
        if transceiver.kind == "video":
            cap_remb(transceiver.receiver, kbps * 1000)
    return video_bandwidth_lines(answer_sdp, kbps)


def video_bandwidth_lines(sdp: str, kbps: int) -> str:
    """`sdp` with `b=AS:<kbps>` in each video section the server receives on and that has no b= line yet.

    SDP orders a section's lines m=, i=, c=, b=, then a= (RFC 4566 section 5), so b= goes right after c=.
    Other sections, audio included, are left as they are.
    """
    sections: list[list[str]] = [[]]
    for line in sdp.splitlines():
        if line.startswith("m="):
            sections.append([])
        sections[-1].append(line)
    for section in sections[1:]:
        if not section[0].startswith("m=video") or any(line.startswith("b=") for line in section):
            continue
        if not any(line in RECEIVING for line in section):
            continue
        after = next((i + 1 for i, line in enumerate(section) if line.startswith("c=")), 1)
        section.insert(after, f"b=AS:{kbps}")
    return "\r\n".join(line for section in sections for line in section) + "\r\n"
