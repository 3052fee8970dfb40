"""signaling/ptime.py: the talker's packet time from the offer, and the ptime answers ask for."""

from __future__ import annotations

from aiortc import RTCPeerConnection

from rtc_omni.signaling.ice import rtc_configuration
from rtc_omni.signaling.ptime import talker_packet_ms, with_audio_ptime

OFFER = "v=0\r\nm=audio 9 UDP/TLS/RTP/SAVPF 111\r\na=rtpmap:111 opus/48000/2\r\n{extra}m=video 9 RTP/SAVPF 96\r\n"


def test_the_talker_sends_the_configured_packets_unless_the_offer_allows_less() -> None:
    assert talker_packet_ms(OFFER.format(extra=""), 120) == 120
    assert talker_packet_ms(OFFER.format(extra="a=maxptime:120\r\n"), 120) == 120
    assert talker_packet_ms(OFFER.format(extra="a=maxptime:100\r\n"), 120) == 60  # no 100 ms choice
    assert talker_packet_ms(OFFER.format(extra="a=maxptime:120\r\n"), 60) == 60  # the setting caps it
    assert talker_packet_ms(OFFER.format(extra="a=maxptime:40\r\n"), 120) == 40
    assert talker_packet_ms(OFFER.format(extra="a=ptime:20\r\n"), 120) == 20
    assert talker_packet_ms(OFFER.format(extra="a=maxptime:10\r\n"), 120) == 20  # Opus in WebRTC: 20 at least
    assert talker_packet_ms(OFFER.format(extra="a=maxptime:junk\r\n"), 120) == 120


async def test_answers_ask_for_60_ms_audio_packets_in_audio_sections_only() -> None:
    offerer, answerer = RTCPeerConnection(rtc_configuration([])), RTCPeerConnection(rtc_configuration([]))
    try:
        offerer.addTransceiver("audio")
        offerer.addTransceiver("video")
        await offerer.setLocalDescription(await offerer.createOffer())
        await answerer.setRemoteDescription(offerer.localDescription)
        await answerer.setLocalDescription(await answerer.createAnswer())
        answer = with_audio_ptime(answerer.localDescription.sdp)
    finally:
        await offerer.close()
        await answerer.close()
    audio, video = answer.split("m=audio")[1].split("m=video")
    assert "a=ptime:60\r\n" in audio and "a=ptime" not in video
    assert with_audio_ptime(answer) == answer  # an answer that has one keeps it
