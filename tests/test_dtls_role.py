"""The server's DTLS role: passive when the offer says actpass, as the offer demands otherwise.

As the DTLS server, aiortc's ECDSA certificate picks the cipher suite, so peers with RSA
certificates (GStreamer, tests/test_gstreamer.py) connect too; FFmpeg's fixed roles are kept.
"""

from __future__ import annotations

import pytest
from aiortc import RTCPeerConnection, RTCSessionDescription

from rtc_omni.signaling.dtls import passive_when_offered_actpass
from rtc_omni.signaling.ice import rtc_configuration

from .conftest import ClientFactory, ServerFactory


@pytest.mark.parametrize(
    ("offered", "answered"), [("actpass", "passive"), ("active", "passive"), ("passive", "active")]
)
async def test_answer_setup_follows_the_offer(offered: str, answered: str) -> None:
    offerer, answerer = RTCPeerConnection(rtc_configuration([])), RTCPeerConnection(rtc_configuration([]))
    try:
        offerer.createDataChannel("control")
        await offerer.setLocalDescription(await offerer.createOffer())
        offer = RTCSessionDescription(
            offerer.localDescription.sdp.replace("a=setup:actpass", f"a=setup:{offered}"), "offer"
        )
        await answerer.setRemoteDescription(offer)
        answer = passive_when_offered_actpass(offer, await answerer.createAnswer())
        await answerer.setLocalDescription(answer)
        assert f"a=setup:{answered}" in answerer.localDescription.sdp
    finally:
        await offerer.close()
        await answerer.close()


async def test_an_aiortc_peer_connects_with_the_server_as_dtls_server(
    make_server: ServerFactory, make_client: ClientFactory
) -> None:
    server = await make_server()
    client = await make_client(server, colour="red", tone=None, config={"modalities": ["text"]})
    assert "a=setup:passive" in client.pc.remoteDescription.sdp
    await client.wait_event("video.frame.ack")
    result = await client.ask("What do you see?")
    assert "mostly red" in result.text
