"""The camera bitrate the server asks for: b=AS on the video m-lines of its answers, a REMB ceiling."""

from __future__ import annotations

import asyncio

import pytest
from aiortc.rtp import RTCP_PSFB_APP, AnyRtcpPacket, RtcpPsfbPacket, unpack_remb_fci

from rtc_omni.client.media import COLOURS, ColourVideoTrack
from rtc_omni.client.rtc_peers import UnderstandClient
from rtc_omni.signaling.bitrate import video_bandwidth_lines

from .conftest import ServerFactory
from .whip_client import SDP, http_raw, publisher_offer

ANSWER = "\r\n".join(
    [
        "v=0",
        "o=- 1 1 IN IP4 0.0.0.0",
        "s=-",
        "t=0 0",
        "m=video 9 UDP/TLS/RTP/SAVPF 97",
        "c=IN IP4 127.0.0.1",
        "a=recvonly",
        "a=rtpmap:97 VP8/90000",
        "m=audio 9 UDP/TLS/RTP/SAVPF 96",
        "c=IN IP4 127.0.0.1",
        "a=sendrecv",
        "a=rtpmap:96 opus/48000/2",
        "m=video 9 UDP/TLS/RTP/SAVPF 97",
        "c=IN IP4 127.0.0.1",
        "a=sendonly",
        "a=rtpmap:97 VP8/90000",
        "",
    ]
)


def sections(sdp: str) -> list[list[str]]:
    """The media sections of `sdp`, each a list of its lines."""
    found: list[list[str]] = []
    for line in sdp.splitlines():
        if line.startswith("m="):
            found.append([])
        if found:
            found[-1].append(line)
    return found


def test_b_as_goes_after_c_in_the_video_sections_the_server_receives_on_only() -> None:
    received_video, audio, sent_video = sections(video_bandwidth_lines(ANSWER, 300))
    assert received_video[1:3] == ["c=IN IP4 127.0.0.1", "b=AS:300"]
    assert not any(line.startswith("b=") for line in audio + sent_video)
    assert video_bandwidth_lines(video_bandwidth_lines(ANSWER, 300), 100).count("b=AS") == 1  # kept, not doubled


@pytest.mark.media
@pytest.mark.parametrize("kbps", [300, 0])
async def test_whip_answer_asks_for_the_configured_video_bitrate(make_server: ServerFactory, kbps: int) -> None:
    server = await make_server(max_video_bitrate=kbps)
    pc, offer = await publisher_offer()
    try:
        status, _headers, answer = await http_raw(server, "POST", "/whip", data=offer, headers=SDP)
        assert status == 201, answer
        video, audio = sections(answer)
        assert video[0].startswith("m=video") and audio[0].startswith("m=audio")
        assert [line for line in video if line.startswith("b=")] == ([f"b=AS:{kbps}"] if kbps else [])
        assert not any(line.startswith("b=") for line in audio)
    finally:
        await pc.close()


@pytest.mark.media
async def test_the_servers_remb_never_asks_for_more_than_the_cap(make_server: ServerFactory) -> None:
    """An aiortc camera (which honours REMB) hears at most --max-video-bitrate; uncapped, aiortc's
    estimate starts near the incoming rate, several kb/s for this camera."""
    server = await make_server(max_video_bitrate=1)
    camera = ColourVideoTrack(COLOURS["red"], 320, 240, 30, moving=True)
    client = UnderstandClient(server.url, video=camera, audio=None, receive_audio=False)
    remb: list[int] = []
    try:
        await client.connect()
        sender = next(t.sender for t in client.pc.getTransceivers() if t.kind == "video")
        handle = sender._handle_rtcp_packet

        async def record_remb(packet: AnyRtcpPacket) -> None:
            if isinstance(packet, RtcpPsfbPacket) and packet.fmt == RTCP_PSFB_APP:
                remb.append(unpack_remb_fci(packet.fci)[0])
            await handle(packet)

        sender._handle_rtcp_packet = record_remb  # type: ignore[method-assign]
        async with asyncio.timeout(15):
            while len(remb) < 2:
                await asyncio.sleep(0.1)
    finally:
        await client.close()
    assert all(0 < bitrate <= 1000 for bitrate in remb), remb
