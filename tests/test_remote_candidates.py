"""--max-remote-candidates: remote ICE candidates are capped per peer, in offers and trickled by PATCH.

aioice's cost per remote candidate grows with their number: two PATCHes of 3000 candidates froze
the event loop for 9-17 s. Past the cap a PATCH gets a 422 naming the setting, an offer a 400, and
the session goes on.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from aiortc import RTCSessionDescription
from yarl import URL

from .conftest import ServerFactory
from .waiting import wait_until
from .whip_client import SDP, http_raw, publisher_offer

CAP = 8
SDPFRAG = {"Content-Type": "application/trickle-ice-sdpfrag"}


def fragment(first_port: int, count: int) -> str:
    lines = [f"a=candidate:{i} 1 udp 2130706431 127.0.0.1 {first_port + i} typ host" for i in range(count)]
    return "a=mid:0\r\n" + "\r\n".join(lines) + "\r\n"


async def test_trickled_candidates_past_the_cap_are_refused_and_the_publisher_goes_on(
    make_server: ServerFactory,
) -> None:
    server = await make_server(max_remote_candidates=CAP)
    pc, offer = await publisher_offer(audio=False)  # its offer carries one candidate
    trickling = offer.replace("a=end-of-candidates\r\n", "")  # more to come, by PATCH
    try:
        status, headers, answer = await http_raw(server, "POST", "/whip", data=trickling, headers=SDP)
        assert status == 201
        location = headers["Location"]
        assert (await http_raw(server, "PATCH", location, data=fragment(40001, 5), headers=SDPFRAG))[0] == 204
        status, _, body = await http_raw(server, "PATCH", location, data=fragment(40101, 5), headers=SDPFRAG)
        assert status == 422 and f"at most {CAP} remote ICE candidates" in body and "--max-remote-candidates" in body
        assert (await http_raw(server, "PATCH", location, data=fragment(40201, 2), headers=SDPFRAG))[0] == 204

        await pc.setRemoteDescription(RTCSessionDescription(sdp=answer, type="answer"))
        await wait_until(lambda: pc.connectionState == "connected", timeout=10)
        session_id = URL(location).path.rsplit("/", 1)[1]
        opens = {"Authorization": f"Bearer {headers['Session-Token']}"}
        assert (await http_raw(server, "GET", f"/v1/rtc/sessions/{session_id}", headers=opens))[0] == 200
    finally:
        await pc.close()


def as_json_offer(sdp: str) -> dict[str, Any]:
    return {"json": {"sdp": sdp, "type": "offer", "kind": "understand"}}


def as_sdp_body(sdp: str) -> dict[str, Any]:
    return {"data": sdp, "headers": SDP}


# Every endpoint that takes a new session's offer (WHEP's viewer offers go through the same parse_offer).
OFFER_ENDPOINTS = [
    ("/v1/rtc/offer", as_json_offer),
    ("/whip", as_sdp_body),
    ("/v1/realtime/calls", as_sdp_body),
    ("/v1/realtime?model=m", as_sdp_body),
]


@pytest.mark.parametrize("path, body", OFFER_ENDPOINTS, ids=[path for path, _ in OFFER_ENDPOINTS])
async def test_an_offer_with_too_many_candidates_is_refused(
    make_server: ServerFactory, path: str, body: Callable[[str], dict[str, Any]]
) -> None:
    server = await make_server(max_remote_candidates=CAP)
    pc, offer = await publisher_offer(audio=False)
    try:
        crowded = offer.replace(
            "a=end-of-candidates", fragment(41001, CAP).removeprefix("a=mid:0\r\n") + "a=end-of-candidates", 1
        )
        status, _, text = await http_raw(server, "POST", path, **body(crowded))
        assert status == 400 and f"at most {CAP} per peer" in text, text
        assert len(server.registry) == 0
    finally:
        await pc.close()
