"""WHIP ingest with an aiortc publisher: HTTP semantics (RFC 9725), Bearer auth, a controller
attached by session id, and teardown freeing the session."""

from __future__ import annotations

import asyncio

import pytest
from aiortc import RTCPeerConnection, RTCSessionDescription
from yarl import URL

from rtc_omni.client.rtc_peers import SignalingError, UnderstandClient
from rtc_omni.signaling.ice import rtc_configuration

from .conftest import RunningServer, ServerFactory, http_json
from .waiting import wait_until
from .whip_client import AUTH, SDP, TOKEN, http_raw, publisher_offer


@pytest.mark.media
async def test_whip_publisher_with_a_controller(make_server: ServerFactory) -> None:
    server = await make_server(auth_token=TOKEN, spoken_sentences=1)
    pc, offer = await publisher_offer()
    status, headers, answer = await http_raw(server, "POST", "/whip", data=offer, headers={**AUTH, **SDP})
    assert status == 201, answer
    assert headers["Content-Type"] == "application/sdp"
    location = headers["Location"]
    session_id = URL(location).path.rsplit("/", 1)[1]
    assert location == f"{server.url}/whip/{session_id}?access_token={headers['Session-Token']}"
    assert len(session_id) >= 22 and headers["View-Token"] != headers["Session-Token"]
    assert headers["ETag"].startswith('"') and headers["Accept-Patch"] == "application/trickle-ice-sdpfrag"
    assert "a=recvonly" in answer and "a=sendrecv" not in answer and "a=sendonly" not in answer
    await pc.setRemoteDescription(RTCSessionDescription(sdp=answer, type="answer"))
    await wait_until(lambda: pc.connectionState == "connected")

    controller = UnderstandClient(server.url, video=None, audio=None, token=TOKEN)
    try:
        await controller.connect(kind="control", session_id=session_id)
        await controller.wait_event("video.frame.ack", timeout=10)
        await asyncio.sleep(1.0)  # let the tone fill the audio buffer
        result = await controller.ask("What do you see and hear?")
        assert "mostly red" in result.text and "dominant frequency about 440 Hz" in result.text
        assert controller.recorder is not None
        assert controller.recorder.voiced_frames(result.sent_at, result.done_at) > 25  # the talker reached it
        stats = (await http_json(server, "GET", f"/v1/rtc/sessions/{session_id}", headers=AUTH))[1]
        assert stats["attached_peers"] == 1 and stats["frames_received"] > 0

        peer = server.registry.get(session_id)
        assert (await http_raw(server, "DELETE", location, headers=AUTH))[0] == 200
        assert session_id not in server.registry and peer.pc.connectionState == "closed"
        assert not peer.attached and peer.outgoing.readyState == "ended"
        assert (await http_raw(server, "DELETE", location, headers=AUTH))[0] == 404
        await wait_until(lambda: controller.pc.connectionState in ("closed", "failed"), timeout=40)
    finally:
        await controller.close()
        await pc.close()


async def test_whip_http_edge_cases(make_server: ServerFactory) -> None:
    server = await make_server(auth_token=TOKEN)
    pc, offer = await publisher_offer()
    try:
        status, headers, _ = await http_raw(server, "OPTIONS", "/whip")
        assert status == 204 and headers["Accept-Post"] == "application/sdp"
        assert "POST" in headers["Access-Control-Allow-Methods"] and "Link" not in headers
        assert (await http_raw(server, "POST", "/whip", data=offer, headers=SDP))[0] == 401
        wrong = {"Authorization": "Bearer nope", **SDP}
        status, headers, _ = await http_raw(server, "POST", "/whip", data=offer, headers=wrong)
        assert status == 401 and headers["WWW-Authenticate"].startswith("Bearer")
        # a browser publisher on another origin may read the refusal and its challenge
        assert headers["Access-Control-Allow-Origin"] == "*"
        assert "WWW-Authenticate" in headers["Access-Control-Expose-Headers"]
        assert (await http_json(server, "GET", "/v1/rtc/sessions/x"))[0] == 401
        assert (await http_json(server, "GET", "/healthz"))[0] == 200
        json_type = {**AUTH, "Content-Type": "application/json"}
        assert (await http_raw(server, "POST", "/whip", data=offer, headers=json_type))[0] == 415
        assert (await http_raw(server, "POST", "/whip", data="v=0\r\nm=video x\r\n", headers={**AUTH, **SDP}))[0] == 400
        assert (await http_raw(server, "DELETE", "/whip/unknown", headers=AUTH))[0] == 404
        frag = {**AUTH, "Content-Type": "application/trickle-ice-sdpfrag"}
        assert (await http_raw(server, "PATCH", "/whip/unknown", data="", headers=frag))[0] == 404
        assert len(server.registry) == 0
    finally:
        await pc.close()


async def test_whip_patch_trickle_and_refused_restart(server: RunningServer) -> None:
    pc, offer = await publisher_offer(audio=False)
    try:
        status, headers, _ = await http_raw(server, "POST", "/whip", data=offer, headers=SDP)
        assert status == 201
        location, etag = headers["Location"], headers["ETag"]
        frag = {"Content-Type": "application/trickle-ice-sdpfrag"}
        candidate = "a=mid:0\r\na=candidate:1 1 udp 2130706431 127.0.0.1 9 typ host\r\na=end-of-candidates\r\n"
        assert (await http_raw(server, "PATCH", location, data=candidate, headers={**frag, "If-Match": etag}))[0] == 204
        assert (await http_raw(server, "PATCH", location, data=candidate, headers=SDP))[0] == 415
        assert (await http_raw(server, "PATCH", location, data=candidate, headers={**frag, "If-Match": '"x"'}))[
            0
        ] == 412
        restart = "a=ice-ufrag:new1\r\na=ice-pwd:newpasswordnewpasswordnew\r\n"
        for refused in (
            await http_raw(server, "PATCH", location, data=candidate, headers={**frag, "If-Match": "*"}),
            await http_raw(server, "PATCH", location, data=restart, headers=frag),
        ):
            status, _, body = refused
            assert status == 422  # and it says why, and what a publisher does instead
            assert "aiortc #1367" in body and "Resume-Token" in body and "re-publish" in body
        assert (await http_raw(server, "PATCH", location, data="a=candidate:bad", headers=frag))[0] == 400
        assert (await http_raw(server, "DELETE", location))[0] == 200
    finally:
        await pc.close()


async def test_whip_session_limit_gives_503_with_retry_after(make_server: ServerFactory) -> None:
    server = await make_server(max_sessions=1)
    first, offer = await publisher_offer()
    second, offer2 = await publisher_offer()
    try:
        assert (await http_raw(server, "POST", "/whip", data=offer, headers=SDP))[0] == 201
        status, headers, _ = await http_raw(server, "POST", "/whip", data=offer2, headers=SDP)
        assert status == 503 and headers["Retry-After"] == "5"
    finally:
        await first.close()
        await second.close()


async def test_whip_offer_with_two_video_tracks_is_422(server: RunningServer) -> None:
    pc = RTCPeerConnection(rtc_configuration([]))
    pc.addTransceiver("video", direction="sendonly")
    pc.addTransceiver("video", direction="sendonly")
    await pc.setLocalDescription(await pc.createOffer())
    try:
        assert (await http_raw(server, "POST", "/whip", data=pc.localDescription.sdp, headers=SDP))[0] == 422
    finally:
        await pc.close()


async def test_controller_needs_a_running_session(make_server: ServerFactory) -> None:
    server = await make_server(auth_token=TOKEN)
    client = UnderstandClient(server.url, video=None, audio=None, token=TOKEN)
    try:
        with pytest.raises(SignalingError) as unknown:
            await client.connect(kind="control", session_id="no-such-session")
        assert unknown.value.status == 404
    finally:
        await client.close()
