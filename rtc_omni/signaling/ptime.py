"""Audio packet times: what the talker sends, and what the server asks peers to send (RFC 4566 ptime).

Speech needs no 20 ms packets: 60 ms packets carry the same audio in a third of the packets, and
every packet costs the server Python work (SRTP, RTP parsing, jitter buffer, decode hand-off). So
answers carry `a=ptime:60` in their audio sections, which browsers honour for their microphone
(Chromium: 50 -> 17 packets/s), and the talker sends 120 ms packets (--talker-packet-ms) unless the
offer's `a=ptime` or `a=maxptime` asks for less: its audio is ready before its time, so a longer
packet delays nothing, where a microphone's waits for its last sample (docs/protocol.md). aiortc's
SDP model drops both attributes, so they are read and written on the SDP text.

`usedtx=1` (RFC 7587) is not asked for: a browser's mic would then send almost nothing in its
pauses. The mic decoder fills timestamp gaps with silence (patches/decoding.py), so such a pause
would still end a turn, but DTX has not been measured here.
"""

from __future__ import annotations

from ..config import TALKER_PACKET_MS_CHOICES as PACKET_MS_CHOICES

ANSWER_PTIME_MS = 60


def _audio_sections(sdp: str) -> list[list[str]]:
    """The lines of each `m=audio` section."""
    sections: list[list[str]] = []
    current: list[str] | None = None
    for line in sdp.splitlines():
        if line.startswith("m="):
            current = [] if line.startswith("m=audio") else None
            if current is not None:
                sections.append(current)
        if current is not None:
            current.append(line)
    return sections


def talker_packet_ms(offer_sdp: str, preferred_ms: int) -> int:
    """The talker's packet time: `preferred_ms` (--talker-packet-ms), or the longest choice the offer's
    audio allows."""
    limit = preferred_ms
    for section in _audio_sections(offer_sdp)[:1]:
        for line in section:
            name, _, value = line.partition(":")
            if name in ("a=ptime", "a=maxptime"):
                try:
                    limit = min(limit, int(float(value)))
                except ValueError:
                    continue
    return max([ms for ms in PACKET_MS_CHOICES if ms <= limit], default=PACKET_MS_CHOICES[0])


def asked_ptime_ms(sdp: str) -> float | None:
    """The `a=ptime` of the first audio section, or None."""
    for section in _audio_sections(sdp)[:1]:
        for line in section:
            name, _, value = line.partition(":")
            if name == "a=ptime":
                try:
                    return float(value)
                except ValueError:
                    return None
    return None


def with_audio_ptime(answer_sdp: str, ptime_ms: int = ANSWER_PTIME_MS) -> str:
    """`answer_sdp` with `a=ptime` in every audio section that has none."""
    out: list[str] = []
    in_audio = False
    has_ptime = False

    def close_section() -> None:
        if in_audio and not has_ptime:
            out.append(f"a=ptime:{ptime_ms}")

    for line in answer_sdp.splitlines():
        if line.startswith("m="):
            close_section()
            in_audio, has_ptime = line.startswith("m=audio"), False
        elif line.startswith("a=ptime:"):
            has_ptime = True
        out.append(line)
    close_section()
    return "\r\n".join(out) + "\r\n"
