"""aiortc private hook: a viewer's keyframe requests (PLI, FIR) reach a shared encoder.

aiortc's RTCRtpSender answers PLI and FIR by calling its private `_send_keyframe()`, which only
tells its own encoder to make a keyframe. A sender of pre-encoded packets (media/shared_encode.py)
has no encoder of its own, so the request is lost and a viewer that lost a keyframe waits for the
next periodic one. Replacing that one method on that one sender passes the request on. Remove when
aiortc lets a track receive its senders' keyframe requests.
"""

from __future__ import annotations

from collections.abc import Callable

from aiortc import RTCRtpSender


def forward_keyframe_requests(sender: RTCRtpSender, request_keyframe: Callable[[], None]) -> None:
    """Call `request_keyframe` whenever `sender` receives a PLI or FIR."""
    sender._send_keyframe = request_keyframe  # type: ignore[method-assign]
