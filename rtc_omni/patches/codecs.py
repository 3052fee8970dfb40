"""aiortc private read: the codecs a transceiver negotiated.

aiortc filters a transceiver's codecs inside setRemoteDescription and sends with the first one,
but exposes the list only as the private `_codecs` (the W3C equivalent is
RTCRtpSender.getParameters().codecs). Remove when aiortc grows a public getter.
"""

from __future__ import annotations

from aiortc import RTCRtpCodecParameters, RTCRtpTransceiver


def negotiated_codecs(transceiver: RTCRtpTransceiver) -> list[RTCRtpCodecParameters]:
    """The codecs setRemoteDescription left on `transceiver`, the sender's choice first."""
    codecs: list[RTCRtpCodecParameters] = transceiver._codecs
    return codecs
