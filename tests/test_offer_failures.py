"""Offers the server cannot answer: every SDP endpoint answers 400 with a clear message, and the
half-built session (or attached peer) is freed, so such POSTs never fill --max-sessions."""

from __future__ import annotations

import re

import pytest

from rtc_omni.client.rtc_peers import ControlClient, GenerateClient
from rtc_omni.signaling import peer_session as peer_module

from .conftest import RunningServer, ServerFactory, http_json
from .whip_client import SDP, http_raw, publisher_offer


def without_setup(sdp: str) -> str:
    return re.sub(r"a=setup:\w+\r\n", "", sdp)


def with_empty_first_mid(sdp: str) -> str:
    return re.sub(r"a=mid:\S+", "a=mid:", sdp, count=1)


async def usable_offer() -> str:
    pc, sdp = await publisher_offer()
    await pc.close()
    return sdp


async def post_everywhere(server: RunningServer, sdp: str, running: ControlClient) -> list[tuple[str, int, str]]:
    """The offer to all four ways of accepting one: JSON offer, WHIP, controller attach and WHEP on
    the running session (with its session token)."""
    session_id, opens = running.session_id, running.session_headers
    results = []
    for kind in ("understand", "generate"):
        offer = {"sdp": sdp, "type": "offer", "kind": kind}
        status, body = await http_json(server, "POST", "/v1/rtc/offer", json=offer)
        results.append((kind, status, str(body)))
    status, _, text = await http_raw(server, "POST", "/whip", data=sdp, headers=SDP)
    results.append(("whip", status, text))
    offer = {"sdp": sdp, "type": "offer", "kind": "control", "session_id": session_id}
    status, body = await http_json(server, "POST", "/v1/rtc/offer", json=offer, headers=opens)
    results.append(("control", status, str(body)))
    status, _, text = await http_raw(server, "POST", f"/whep/{session_id}", data=sdp, headers={**SDP, **opens})
    results.append(("whep", status, text))
    return results


@pytest.mark.parametrize(
    "mutate, message",
    [(without_setup, "no a=setup"), (with_empty_first_mid, "empty a=mid")],
    ids=["no-setup", "empty-mid"],
)
async def test_offers_aiortc_cannot_answer_get_400_and_never_fill_max_sessions(
    make_server: ServerFactory, mutate, message: str
) -> None:
    server = await make_server(max_sessions=3)
    running = GenerateClient(server.url)
    try:
        await running.connect()
        assert running.session_id is not None
        bad = mutate(await usable_offer())
        for _ in range(2):  # more bad offers than the two free places
            for endpoint, status, body in await post_everywhere(server, bad, running):
                assert status == 400, (endpoint, status, body)
                assert message in body, (endpoint, body)
        assert len(server.registry) == 1
        assert not server.registry.get(running.session_id).attached
        status, _, answer = await http_raw(server, "POST", "/whip", data=await usable_offer(), headers=SDP)
        assert status == 201, answer
    finally:
        await running.close()


async def test_any_error_while_accepting_an_offer_is_a_400_and_frees_the_session(
    make_server: ServerFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    server = await make_server(max_sessions=2)
    running = GenerateClient(server.url)
    try:
        await running.connect()
        assert running.session_id is not None

        async def broken_answer(self):
            raise KeyError("an aiortc internal")

        monkeypatch.setattr(peer_module._PeerLink, "_answer", broken_answer)
        for endpoint, status, body in await post_everywhere(server, await usable_offer(), running):
            assert status == 400 and "KeyError" in body, (endpoint, status, body)
        assert len(server.registry) == 1 and not server.registry.get(running.session_id).attached
        monkeypatch.undo()
        status, _, answer = await http_raw(server, "POST", "/whip", data=await usable_offer(), headers=SDP)
        assert status == 201, answer
    finally:
        await running.close()
