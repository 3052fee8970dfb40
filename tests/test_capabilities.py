"""Capabilities per session (docs/operations.md, "Who may act on a session"): a session's own tokens open it and
nothing else, a view token only watches, the server token opens everything, and a refused request
leaves the session going on."""

from __future__ import annotations

import json
import logging
from typing import Any

import aiohttp
import pytest
from aiohttp.test_utils import make_mocked_request
from aiortc import RTCPeerConnection, RTCSessionDescription

from rtc_omni.client.rtc_peers import GenerateClient, SignalingError, UnderstandClient
from rtc_omni.signaling.capabilities import RedactingAccessLogger
from rtc_omni.signaling.ice import rtc_configuration

from .conftest import RunningServer, ServerFactory, http_json
from .generate_client import SMALL, connect, received_through
from .waiting import wait_until
from .whep_player import WhepPlayer
from .whip_client import SDP, http_raw, publisher_offer

pytestmark = pytest.mark.media  # real aiortc peers

OPERATOR = "operator-s3cret"


def bearer(token: str | None) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


async def attach(server: RunningServer, session_id: str, token: str | None) -> int:
    """A controller's offer (kind "control") on the session with `token`; returns the HTTP status."""
    controller = UnderstandClient(server.url, video=None, audio=None, token=token)
    try:
        await controller.connect(kind="control", session_id=session_id)
        return 200
    except SignalingError as refused:
        return refused.status
    finally:
        await controller.close()


async def test_another_client_cannot_watch_end_attach_to_or_fetch_from_a_session(make_server: ServerFactory) -> None:
    server = await make_server(synthetic_chunk_frames=6, synthetic_first_chunk_latency=0.05)
    owner, other = await connect(server), await connect(server)
    try:
        await owner.start(prompt="mine", fps=30, num_frames=12, record=True, **SMALL)
        done = await owner.wait_event("session.done", timeout=20)
        path = f"/v1/rtc/sessions/{owner.session_id}"
        for token in (None, other.session_token, other.view_token):  # no token, and another session's
            headers = bearer(token) if token else {}
            assert (await http_json(server, "GET", path, headers=headers))[0] == 401
            assert (await http_json(server, "DELETE", path, headers=headers))[0] == 401
            assert (await http_json(server, "GET", path + "/recording", headers=headers))[0] == 401
            assert (await http_raw(server, "POST", f"/whep/{owner.session_id}", data="v=0", headers=SDP))[0] == 401
            assert await attach(server, str(owner.session_id), token) == 401
        status, body = await http_json(server, "DELETE", path)
        assert "token" in body["error"] and owner.session_id in server.registry  # refused, and it goes on

        async with aiohttp.ClientSession() as http:  # its own client fetches the recording by its URL
            async with http.get(server.url + done["recording"]) as response:
                assert response.status == 200 and response.content_type == "video/mp4"
        status, stats = await http_json(server, "GET", path, headers=owner.session_headers)
        assert status == 200 and stats["connection_state"] == "connected" and stats["frames_sent"] == 12
        assert (await http_json(server, "DELETE", path, headers=owner.session_headers))[0] == 200
        assert owner.session_id not in server.registry and other.session_id in server.registry
    finally:
        await owner.close()
        await other.close()


async def test_a_whep_view_url_watches_but_cannot_control_or_end_the_session(make_server: ServerFactory) -> None:
    server = await make_server(synthetic_chunk_frames=20, synthetic_first_chunk_latency=0.3)
    creator = await connect(server)
    player = WhepPlayer("video")
    smuggled = player.pc.createDataChannel("control")  # a viewer offering a control channel
    try:
        assert creator.view_url is not None and creator.session_token not in creator.view_url
        status, headers, answer = await http_raw(
            server, "POST", creator.view_url, data=await player.offer(), headers=SDP
        )  # the URL alone, as a WHEP player opens it
        assert status == 201, answer
        await player.pc.setRemoteDescription(RTCSessionDescription(sdp=answer, type="answer"))
        await wait_until(lambda: player.pc.connectionState == "connected")
        await wait_until(lambda: smuggled.readyState == "closed", timeout=10)  # the server closed it

        view = bearer(creator.view_token)
        path = f"/v1/rtc/sessions/{creator.session_id}"
        status, body = await http_json(server, "DELETE", path, headers=view)
        assert status == 403 and "view token" in body["error"]
        assert (await http_json(server, "DELETE", f"{path}?access_token={creator.view_token}"))[0] == 403
        assert await attach(server, str(creator.session_id), creator.view_token) == 403
        assert (await http_json(server, "GET", path, headers=view))[0] == 200  # stats are watching

        await creator.start(prompt="a red square", fps=16, num_frames=40, **SMALL)
        await creator.wait_event("session.done", timeout=30)
        frames = await received_through(player.video, 39)
        assert [f.index for f in frames] == list(range(40))  # the viewer saw it all
        assert creator.session_id in server.registry
        assert (await http_raw(server, "DELETE", headers["Location"]))[0] == 200  # it ends its own viewing
        assert creator.session_id in server.registry
    finally:
        await player.close()
        await creator.close()


async def test_the_operator_token_opens_every_session_and_a_session_token_opens_only_its_own(
    make_server: ServerFactory,
) -> None:
    server = await make_server(auth_token=OPERATOR, spoken_sentences=1)
    operator = bearer(OPERATOR)
    pc, offer = await publisher_offer()
    owner = GenerateClient(server.url, token=OPERATOR)
    try:
        assert (await http_raw(server, "POST", "/whip", data=offer, headers=SDP))[0] == 401
        status, headers, answer = await http_raw(server, "POST", "/whip", data=offer, headers={**operator, **SDP})
        assert status == 201, answer
        await pc.setRemoteDescription(RTCSessionDescription(sdp=answer, type="answer"))
        location, whip_token = headers["Location"], headers["Session-Token"]
        whip_id = location.split("?")[0].rsplit("/", 1)[1]
        await owner.connect()
        generate_path = f"/v1/rtc/sessions/{owner.session_id}"

        # A session token opens its own session, without the server token, and nothing else.
        assert await attach(server, whip_id, whip_token) == 200
        assert (await http_json(server, "GET", generate_path, headers=bearer(whip_token)))[0] == 401
        assert await attach(server, str(owner.session_id), whip_token) == 401
        sdp = {"sdp": offer, "type": "offer", "kind": "understand"}
        assert (await http_json(server, "POST", "/v1/rtc/offer", json=sdp, headers=bearer(whip_token)))[0] == 401

        # The operator opens both.
        assert (await http_json(server, "GET", f"/v1/rtc/sessions/{whip_id}", headers=operator))[0] == 200
        assert await attach(server, str(owner.session_id), OPERATOR) == 200
        assert (await http_json(server, "DELETE", generate_path, headers=operator))[0] == 200
        # The WHIP Location alone ends its session, as a publisher holding no token would.
        assert (await http_raw(server, "DELETE", location.split("?")[0]))[0] == 401
        assert (await http_raw(server, "DELETE", location))[0] == 200
        assert len(server.registry) == 0
    finally:
        await owner.close()
        await pc.close()


async def test_a_realtime_call_is_hung_up_with_its_session_token_only(server: RunningServer) -> None:
    pc = RTCPeerConnection(rtc_configuration([]))
    pc.createDataChannel("oai-events")
    pc.addTransceiver("audio", direction="sendrecv")
    try:
        await pc.setLocalDescription(await pc.createOffer())
        status, headers, answer = await http_raw(
            server, "POST", "/v1/realtime/calls", data=pc.localDescription.sdp, headers=SDP
        )
        assert status == 201, answer
        call = headers["Location"]
        assert "?" not in call  # OpenAI's clients read the call id from it
        assert (await http_raw(server, "POST", call + "/hangup", headers=bearer("sk-anything")))[0] == 401
        assert (await http_raw(server, "DELETE", call, headers=bearer(headers["View-Token"])))[0] == 403
        assert (await http_raw(server, "POST", call + "/hangup", headers=bearer(headers["Session-Token"])))[0] == 200
    finally:
        await pc.close()


def test_the_access_log_masks_tokens(caplog: pytest.LogCaptureFixture) -> None:
    request = make_mocked_request(
        "DELETE", "/whip/abc?access_token=SECRET1&x=1", headers={"Referer": "http://h/p?access_token=SECRET2"}
    )
    response: Any = type("Response", (), {"status": 200, "body_length": 0, "headers": {}})()
    logger = logging.getLogger("test.access")
    with caplog.at_level(logging.INFO, logger="test.access"):
        RedactingAccessLogger(logger, '"%r" %s "%{Referer}i"').log(request, response, 0.01)
    line = json.dumps([record.getMessage() for record in caplog.records])
    assert "SECRET" not in line and "/whip/abc?access_token=-&x=1" in line and "p?access_token=-" in line
