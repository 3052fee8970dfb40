"""The DTLS role the server takes: passive (DTLS server) whenever the offer leaves it the choice.

An offer with `a=setup:actpass` lets the answerer pick. aiortc answers `active` and becomes the
DTLS client, but its client offers only ECDHE-ECDSA cipher suites, so a peer whose DTLS server
has an RSA certificate (GStreamer's webrtcbin, meetecho's whip/whep clients) fails with "no shared
cipher". As the DTLS server, aiortc's ECDSA certificate decides the suite, and every peer can
connect whatever its own certificate: RFC 5763 section 5 allows either answer. Offers that fix the
role (`active`: FFmpeg with `-whip_flags dtls_active`; `passive`: FFmpeg's default) are answered
as before. Only public aiortc API is used: the answer is rewritten before setLocalDescription,
which takes the role from it.
"""

from __future__ import annotations

from aiortc import RTCSessionDescription
from aiortc.sdp import SessionDescription


def passive_when_offered_actpass(offer: RTCSessionDescription, answer: RTCSessionDescription) -> RTCSessionDescription:
    """`answer`, with `a=setup:passive` in every media section whose offer said `a=setup:actpass`."""
    offered = SessionDescription.parse(offer.sdp).media
    description = SessionDescription.parse(answer.sdp)
    for offer_media, answer_media in zip(offered, description.media, strict=False):
        if offer_media.dtls is not None and offer_media.dtls.role == "auto" and answer_media.dtls is not None:
            answer_media.dtls.role = "server"
    return RTCSessionDescription(sdp=str(description), type=answer.type)
