"""WHEP egress: aiortc players watch a generation session's video and hear an understanding
session's talker; viewers of one codec share one encode; HTTP semantics of the viewer resource."""

from __future__ import annotations

from typing import Any

import pytest
from aiortc import RTCPeerConnection, RTCRtpReceiver, RTCSessionDescription
from aiortc.mediastreams import MediaStreamTrack

from rtc_omni.client.media import AudioRecorder, VideoReceiver
from rtc_omni.client.peer import ControlClient, GenerateClient
from rtc_omni.signaling import peer as peer_module
from rtc_omni.signaling.ice import rtc_configuration

from .conftest import ClientFactory, RunningServer, ServerFactory, http_json
from .test_generate_rtc import received_through
from .test_lifecycle import server_tasks, wait_until
from .test_whip import AUTH, SDP, TOKEN, http_raw

pytestmark = pytest.mark.media


def viewing(client: ControlClient) -> dict[str, str]:
    """The headers of a WHEP player given the client's view token (the view URL's capability)."""
    return {"Authorization": f"Bearer {client.view_token}"}


class WhepPlayer:
    """A WHEP player: a recvonly offer POSTed as application/sdp, the answer applied."""

    def __init__(self, kind: str, codec: str | None = None) -> None:
        self.pc = RTCPeerConnection(rtc_configuration([]))
        transceiver = self.pc.addTransceiver(kind, direction="recvonly")
        if codec is not None:
            capabilities = RTCRtpReceiver.getCapabilities(kind)
            assert capabilities is not None
            transceiver.setCodecPreferences([c for c in capabilities.codecs if c.mimeType.lower() == codec])
        self.video: VideoReceiver | None = None
        self.audio: AudioRecorder | None = None
        self.location = ""
        self.pc.on("track", self._on_track)

    def _on_track(self, track: MediaStreamTrack) -> None:
        if track.kind == "video":
            self.video = VideoReceiver(track)
        else:
            self.audio = AudioRecorder(track)

    async def offer(self) -> str:
        await self.pc.setLocalDescription(await self.pc.createOffer())
        return self.pc.localDescription.sdp

    async def play(self, server: RunningServer, session_id: str, headers: dict[str, str] | None = None) -> Any:
        """POST the offer; on 201 apply the answer and wait until connected. Returns the headers."""
        status, response_headers, body = await http_raw(
            server, "POST", f"/whep/{session_id}", data=await self.offer(), headers={**SDP, **(headers or {})}
        )
        assert status == 201, body
        assert "a=sendonly" in body and response_headers["ETag"].startswith('"')
        self.location = response_headers["Location"]
        await self.pc.setRemoteDescription(RTCSessionDescription(sdp=body, type="answer"))
        await wait_until(lambda: self.pc.connectionState == "connected")
        return response_headers

    async def close(self) -> None:
        for receiver in (self.video, self.audio):
            if receiver is not None:
                await receiver.stop()
        await self.pc.close()


@pytest.mark.parametrize("codec", ["video/vp8", "video/h264"])
async def test_two_players_share_one_encode_of_the_generated_video(make_server: ServerFactory, codec: str) -> None:
    server = await make_server(synthetic_chunk_frames=20, synthetic_first_chunk_latency=0.3)
    creator = GenerateClient(server.url)
    players = [WhepPlayer("video", codec), WhepPlayer("video", codec)]
    try:
        await creator.connect()
        assert creator.session_id is not None
        for player in players:
            await player.play(server, creator.session_id, viewing(creator))
        stats = (await http_json(server, "GET", f"/v1/rtc/sessions/{creator.session_id}", headers=viewing(creator)))[1]
        assert stats["shared_encoders"] == {codec: 2} and stats["attached_peers"] == 2
        await creator.start(prompt="a red square", fps=16, num_frames=40, size="320x240")
        await creator.wait_event("session.done", timeout=30)
        for receiver in [creator.receiver] + [player.video for player in players]:
            frames = await received_through(receiver, 39)
            assert [f.index for f in frames] == list(range(40))  # in order, none missing
    finally:
        for player in players:
            await player.close()
        await creator.close()
    await wait_until(lambda: len(server.registry) == 0 and not server_tasks())


async def test_a_player_hears_the_talker_of_an_understanding_session(
    make_server: ServerFactory, make_client: ClientFactory
) -> None:
    server = await make_server(spoken_sentences=1)
    client = await make_client(server, colour="red", tone=440.0, config={})
    player = WhepPlayer("audio")
    try:
        assert client.session_id is not None
        await player.play(server, client.session_id, viewing(client))
        await client.wait_event("video.frame.ack")
        result = await client.ask("What do you see?")
        assert "mostly red" in result.text
        assert player.audio is not None
        await wait_until(lambda: player.audio is not None and player.audio.voiced_frames(result.sent_at) > 25)
        assert (await http_raw(server, "DELETE", player.location))[0] == 200
        assert client.session_id in server.registry  # a viewer leaving does not end the session
        assert (await http_raw(server, "DELETE", player.location))[0] == 404
    finally:
        await player.close()


async def test_whep_http_edge_cases(
    make_server: ServerFactory, make_client: ClientFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    server = await make_server(auth_token=TOKEN)
    client = await make_client(server, colour="red", tone=None, token=TOKEN)
    first, second, video = WhepPlayer("audio"), WhepPlayer("audio"), WhepPlayer("video")
    monkeypatch.setattr(peer_module, "MAX_ATTACHED_PEERS", 1)
    try:
        session = f"/whep/{client.session_id}"
        status, headers, _ = await http_raw(server, "OPTIONS", session)
        assert status == 204 and headers["Accept-Post"] == "application/sdp"
        offer = await first.offer()
        assert (await http_raw(server, "POST", session, data=offer, headers=SDP))[0] == 401
        assert (await http_raw(server, "POST", "/whep/unknown", data=offer, headers={**AUTH, **SDP}))[0] == 404
        json_type = {**AUTH, "Content-Type": "application/json"}
        assert (await http_raw(server, "POST", session, data=offer, headers=json_type))[0] == 415
        assert (await http_raw(server, "POST", session, data="v=0\r\nm=x\r\n", headers={**AUTH, **SDP}))[0] == 400
        video_offer = await video.offer()  # an understanding session sends audio, not video
        assert (await http_raw(server, "POST", session, data=video_offer, headers={**AUTH, **SDP}))[0] == 422

        headers = await first.play(server, str(client.session_id), AUTH)
        assert headers["Location"].startswith(f"{server.url}{session}/")
        status, headers, _ = await http_raw(server, "POST", session, data=await second.offer(), headers={**AUTH, **SDP})
        assert status == 503 and headers["Retry-After"]
        assert (await http_raw(server, "OPTIONS", first.location))[1]["Accept-Patch"] == (
            "application/trickle-ice-sdpfrag"
        )
        status, headers, _ = await http_raw(server, "DELETE", first.location.split("?")[0])
        assert status == 401 and headers["Access-Control-Allow-Origin"] == "*"  # readable on any origin
        assert (await http_raw(server, "DELETE", first.location, headers=AUTH))[0] == 200
        await wait_until(lambda: first.pc.connectionState in ("closed", "failed"), timeout=40)
    finally:
        for player in (first, second, video):
            await player.close()
