"""WHEP egress: aiortc players watch a generation session's video and hear an understanding
session's talker; viewers of one codec share one encode; HTTP semantics of the viewer resource."""

from __future__ import annotations

import pytest

from rtc_omni.client.rtc_peers import GenerateClient
from rtc_omni.signaling import peer_session as peer_module

from .conftest import ClientFactory, ServerFactory, http_json
from .generate_client import received_through
from .waiting import server_tasks, wait_until
from .whep_player import WhepPlayer, viewing
from .whip_client import AUTH, SDP, TOKEN, http_raw

pytestmark = pytest.mark.media


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
