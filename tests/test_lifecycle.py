"""Signaling errors, session stats, and every way a session ends freeing what it held."""

from __future__ import annotations

import asyncio

import pytest

from rtc_omni.client.rtc_peers import SignalingError, UnderstandClient

from .conftest import ClientFactory, RunningServer, ServerFactory, http_json
from .waiting import server_tasks, wait_until


async def open_session_with_active_turn(server: RunningServer, make_client: ClientFactory):
    client = await make_client(server, colour="red", tone=440.0, config={})
    await client.wait_event("video.frame.ack")
    client.send({"type": "video.query", "text": "keep talking"})
    await client.wait_event("response.text.delta")
    peer = server.registry.get(client.session_id)
    assert peer is not None and server_tasks()
    return client, peer


def assert_freed(server: RunningServer, peer) -> None:
    assert client_id_gone(server, peer.session_id)
    assert peer.session.state == "closed" and peer.closed.is_set()
    assert peer.pc.connectionState == "closed"
    assert peer.outgoing.readyState == "ended"
    stats = peer.session.stats()
    assert stats["frames_buffered"] == 0 and stats["audio_ms_buffered"] == 0 and not stats["turn_active"]
    assert server_tasks() == []


def client_id_gone(server: RunningServer, session_id: str) -> bool:
    return session_id not in server.registry


async def test_delete_ends_the_session_and_frees_everything(server: RunningServer, make_client: ClientFactory) -> None:
    client, peer = await open_session_with_active_turn(server, make_client)
    request_id = next(e["request_id"] for e in client.events if e["type"] == "response.start")

    status, body = await http_json(
        server, "DELETE", f"/v1/rtc/sessions/{client.session_id}", headers=client.session_headers
    )

    assert status == 200 and body["closed"] is True
    assert request_id in server.engine.recent_aborts
    assert_freed(server, peer)
    status, _ = await http_json(server, "GET", f"/v1/rtc/sessions/{client.session_id}", headers=client.session_headers)
    assert status == 404
    await wait_until(lambda: client.pc.connectionState in ("closed", "failed"), timeout=40)


async def test_peer_close_ends_the_session(server: RunningServer, make_client: ClientFactory) -> None:
    client, peer = await open_session_with_active_turn(server, make_client)
    await client.close()
    await wait_until(lambda: client_id_gone(server, peer.session_id))
    await wait_until(lambda: not server_tasks())
    assert_freed(server, peer)


async def test_idle_timeout_ends_the_session(make_server: ServerFactory, make_client: ClientFactory) -> None:
    server = await make_server(idle_timeout=1.0)
    client = await make_client(server, colour=None, tone=None, config={})
    peer = server.registry.get(client.session_id)
    error = await client.wait_event("error", timeout=5)
    assert error["message"] == "Idle timeout"
    await wait_until(lambda: client_id_gone(server, peer.session_id))
    assert_freed(server, peer)


async def test_media_keeps_a_session_from_idling(make_server: ServerFactory, make_client: ClientFactory) -> None:
    server = await make_server(idle_timeout=1.0)
    client = await make_client(server, colour="red", tone=None, config={})
    await asyncio.sleep(2.0)
    assert client.session_id in server.registry
    assert not [e for e in client.events if e["type"] == "error"]


async def test_video_done_waits_for_the_turn_then_ends(server: RunningServer, make_client: ClientFactory) -> None:
    client = await make_client(server, colour="red", tone=None, config={"modalities": ["text"]})
    await client.wait_event("video.frame.ack")
    client.send({"type": "video.query", "text": "last question"})
    client.send({"type": "video.done"})
    done = await client.wait_event("session.done")
    kinds = [e["type"] for e in client.events]
    assert kinds.index("response.text.done") < kinds.index("session.done")
    assert server.engine.recent_aborts == type(server.engine.recent_aborts)()  # nothing was aborted
    assert done.keys() == {"type", "server_event_seq"}  # session.done, numbered for a resume
    await wait_until(lambda: client.session_id not in server.registry)


async def test_session_that_never_connects_is_closed(make_server: ServerFactory) -> None:
    server = await make_server(ice_connect_timeout=0.5)
    client = UnderstandClient(server.url)
    client.pc.addTransceiver("audio", direction="recvonly")
    await client.pc.setLocalDescription(await client.pc.createOffer())
    offer = {"sdp": client.pc.localDescription.sdp, "type": "offer", "kind": "understand"}
    status, body = await http_json(server, "POST", "/v1/rtc/offer", json=offer)
    assert status == 200
    # The answer is never applied, so ICE never completes.
    assert body["session_id"] in server.registry
    await wait_until(lambda: body["session_id"] not in server.registry, timeout=5)
    await client.close()


async def test_stats_report_the_session(server: RunningServer, make_client: ClientFactory) -> None:
    client = await make_client(server, colour="red", tone=440.0, config={"modalities": ["text"]})
    await client.wait_event("video.frame.ack")
    await asyncio.sleep(0.5)
    await client.ask("hello")
    status, stats = await http_json(
        server, "GET", f"/v1/rtc/sessions/{client.session_id}", headers=client.session_headers
    )
    assert status == 200
    assert stats["kind"] == "understand" and stats["connection_state"] == "connected"
    assert stats["frames_received"] > stats["frames_sampled"] >= stats["frames_buffered"] == 1
    assert stats["frames_filtered"] >= 1
    assert stats["turns_started"] == stats["turns_completed"] == 1 and stats["turns_cancelled"] == 0
    assert stats["bytes_received"] > 10_000
    assert stats["audio_ms_buffered"] > 0  # the mic kept talking after the turn took its audio


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ("not json", "body must be JSON"),
        ({"type": "offer"}, "invalid offer"),
        ({"sdp": "v=0\r\n", "type": "answer"}, "invalid offer"),
        ({"sdp": "hello", "type": "offer"}, "SDP must start with v=0"),
        ({"sdp": "v=0\r\no=- 1 1 IN IP4 127.0.0.1\r\ns=-\r\nt=0 0\r\n", "type": "offer"}, "no media"),
        ({"sdp": "v=0\r\nm=video nonsense\r\n", "type": "offer"}, "SDP"),
    ],
)
async def test_bad_offers_get_400_with_a_json_error(server: RunningServer, body, message: str) -> None:
    as_json = {"Content-Type": "application/json"}
    kwargs = {"data": body, "headers": as_json} if isinstance(body, str) else {"json": body}
    status, reply = await http_json(server, "POST", "/v1/rtc/offer", **kwargs)
    assert status == 400 and message in reply["error"]
    assert len(server.registry) == 0


async def test_unknown_sessions_are_404(make_server: ServerFactory) -> None:
    server = await make_server(auth_token="operator")  # only the server token opens any session id
    operator = {"Authorization": "Bearer operator"}
    assert (await http_json(server, "GET", "/v1/rtc/sessions/nope", headers=operator))[0] == 404
    assert (await http_json(server, "DELETE", "/v1/rtc/sessions/nope", headers=operator))[0] == 404


async def test_healthz(server: RunningServer) -> None:
    status, body = await http_json(server, "GET", "/healthz")
    assert status == 200 and body["status"] == "ok" and body["engine"] == "synthetic"


async def test_session_limit_gives_503(make_server: ServerFactory, make_client: ClientFactory) -> None:
    server = await make_server(max_sessions=1)
    await make_client(server, colour=None, tone=None)
    with pytest.raises(SignalingError) as refused:
        await make_client(server, colour=None, tone=None)
    assert refused.value.status == 503


async def test_a_client_asking_stops_waiting_when_the_server_shuts_down(
    make_server: ServerFactory, make_client: ClientFactory
) -> None:
    server = await make_server(spoken_sentences=20)  # a long spoken answer, cut by the shutdown
    client = await make_client(server, colour="red", tone=440.0, config={})
    await client.wait_event("video.frame.ack")
    asking = asyncio.create_task(client.ask("keep talking", timeout=120.0))
    await client.wait_event("response.text.delta")

    await server.server.close()

    async with asyncio.timeout(20):  # not the 120 s the answer was given: the client heard why
        with pytest.raises(ConnectionError, match="Server shutting down"):
            await asking
