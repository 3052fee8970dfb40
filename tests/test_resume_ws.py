"""A WebSocket session outlives a lost socket and is resumed on a new one (docs/resume.md), on vLLM-Omni
0.30's contract: session.created's credentials, `?resume=1` + `session.resume`, `session.resumed` and the
missed events by `server_event_seq`, `session.replaced` for a socket taken over, its error codes."""

from __future__ import annotations

import asyncio
from typing import Any

from pydantic import TypeAdapter

from tests.conftest import RunningServer, ServerFactory
from tests.waiting import wait_until
from tests.wsclient import WsClient, jpeg_b64, tone_pcm_b64

PATH = "/v1/realtime?model=synthetic"
RESUME_TYPES = ("session.resumed", "session.replaced", "session.resync_required")


def url(server: RunningServer, path: str = PATH) -> str:
    return server.url.replace("http://", "ws://") + path


async def resume(
    server: RunningServer, session_id: str, token: str, last_seq: int, path: str = PATH, **extra: Any
) -> WsClient:
    return await WsClient.resume(url(server, path), session_id, token, last_seq, **extra)


def last_seq(client: WsClient) -> int:
    return client.last_seq


def check_with_the_sdk(events: list[dict[str, Any]]) -> None:
    """Every event but resume's own validates as the official SDK's models (extra fields allowed)."""
    from openai.types.realtime import RealtimeServerEvent

    adapter: TypeAdapter[Any] = TypeAdapter(RealtimeServerEvent)
    for event in events:
        if event["type"] not in RESUME_TYPES:
            adapter.validate_python(event)


async def start_answer(client: WsClient) -> dict[str, Any]:
    created = await client.wait_event("session.created")
    item = {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Tell me a story."}]}
    await client.send({"type": "conversation.item.create", "item": item})
    await client.send({"type": "response.create"})
    await client.wait_event("response.output_audio.delta")
    return created


async def test_a_socket_lost_mid_answer_is_resumed_with_nothing_lost_or_repeated(
    make_server: ServerFactory,
) -> None:
    server = await make_server()
    first = await WsClient.connect(url(server))
    created = await start_answer(first)
    assert created["session_id"] in server.registry and created["attachment_generation"] == 1
    first.vanish()  # no closing handshake: a network change
    seen = last_seq(first)
    await wait_until(lambda: server.registry.get(created["session_id"]) is not None)

    second = await resume(server, created["session_id"], created["resume_token"], seen)
    try:
        resumed = await second.wait_event("session.resumed")
        assert resumed["resume_token"] != created["resume_token"] and resumed["attachment_generation"] == 2
        assert resumed["session"]["model"] == "synthetic"
        await second.wait_event("response.done", timeout=30)
        after = [e for e in second.events if "server_event_seq" in e]
        before = [e for e in first.events if "server_event_seq" in e]
        assert [e["server_event_seq"] for e in before + after] == list(range(1, last_seq(second) + 1))
        everything = before + after
        check_with_the_sdk(first.events + second.events)
        spoken = "".join(e["delta"] for e in everything if e["type"] == "response.output_audio_transcript.delta")
        done = next(e for e in everything if e["type"] == "response.output_audio_transcript.done")
        assert spoken == done["transcript"] and 'You asked: "Tell me a story."' in spoken

        # The conversation goes on: the next answer sees the earlier items.
        mark = len(second.events)
        await second.send({"type": "response.create"})
        answer = await second.wait_event("response.output_audio_transcript.done", after=mark, timeout=30)
        assert "I was given 2 earlier conversation items" in answer["transcript"]
        stats = await server.registry.get(created["session_id"]).stats()  # type: ignore[union-attr]
        assert stats["resumes"] == 1 and stats["attached"] is True
    finally:
        await second.close()
        await first.close()


async def test_a_takeover_tells_the_old_socket_it_was_replaced(make_server: ServerFactory) -> None:
    server = await make_server()
    first = await WsClient.connect(url(server))
    created = await first.wait_event("session.created")
    second = await resume(server, created["session_id"], created["resume_token"], 0)
    try:
        await second.wait_event("session.resumed")
        replaced = await first.wait_event("session.replaced")
        assert replaced == {"type": "session.replaced", "session_id": created["session_id"], "attachment_generation": 2}
        await first.wait_closed()
        assert first.ws.close_code == 1000
        await second.send({"type": "session.update", "session": {"type": "realtime", "instructions": "Be brief."}})
        updated = await second.wait_event("session.updated")
        assert updated["server_event_seq"] == 1  # the first event after session.created, on the new socket
    finally:
        await second.close()
        await first.close()


async def test_a_wrong_token_or_an_expired_session_is_refused(make_server: ServerFactory) -> None:
    server = await make_server(resume_grace=0.5)
    first = await WsClient.connect(url(server))
    created = await first.wait_event("session.created")
    first.vanish()
    wrong = await resume(server, created["session_id"], "not-the-token", 0)
    error = await wrong.wait_event("error")
    assert error["error"]["code"] == "invalid_resume_token"
    await wrong.wait_closed()
    await wait_until(lambda: len(server.registry) == 0, timeout=5)  # the grace ran out
    late = await resume(server, created["session_id"], created["resume_token"], 0)
    error = await late.wait_event("error")
    assert error["error"]["code"] == "session_resume_expired"
    await late.wait_closed()
    for client in (first, wrong, late):
        await client.close()


async def test_a_closing_handshake_ends_the_session_at_once(make_server: ServerFactory) -> None:
    server = await make_server()
    client = await WsClient.connect(url(server))
    await client.wait_event("session.created")
    await client.close()
    await wait_until(lambda: len(server.registry) == 0, timeout=2)


async def test_session_close_ends_the_session(make_server: ServerFactory) -> None:
    server = await make_server()
    client = await WsClient.connect(url(server))
    created = await client.wait_event("session.created")
    await client.send({"type": "session.heartbeat"})
    ack = await client.wait_event("session.heartbeat_ack")
    assert ack == {"type": "session.heartbeat_ack", "session_id": created["session_id"], "server_event_seq": 0}
    await client.send({"type": "session.close"})
    closed = await client.wait_event("session.closed")
    assert closed["reason"] == "client_close"
    await client.wait_closed()
    await wait_until(lambda: len(server.registry) == 0, timeout=2)
    await client.close()


async def test_an_understanding_socket_resumes_from_its_upgrade_headers(make_server: ServerFactory) -> None:
    server = await make_server()
    first = await WsClient.connect(url(server, "/v1/video/chat/stream"))
    headers = first.ws._response.headers  # the 101's: this protocol has no created event
    session_id, token = headers["Session-Id"], headers["Resume-Token"]
    await first.send({"type": "session.config", "model": "synthetic"})
    await first.send({"type": "video.frame", "data": jpeg_b64((200, 30, 30))})
    await first.send({"type": "audio.chunk", "data": tone_pcm_b64(440, 1.0)})
    await first.send({"type": "video.query", "text": "What do you hear?"})
    await first.wait_event("response.text.delta")
    first.vanish()
    second = await resume(server, session_id, token, last_seq(first), path="/v1/video/chat/stream")
    try:
        await second.wait_event("session.resumed")
        await second.wait_event("response.audio.done", timeout=30)
        text = "".join(e["delta"] for e in first.events + second.events if e["type"] == "response.text.delta")
        assert text.startswith("I see 1 frame") and "about 440 Hz." in text and text.endswith('"What do you hear?".')
    finally:
        await second.close()
        await first.close()


async def test_resume_off_gives_no_credentials_and_no_numbers(make_server: ServerFactory) -> None:
    server = await make_server(resume_grace=0)
    client = await WsClient.connect(url(server))
    created = await client.wait_event("session.created")
    assert "resume_token" not in created and "Resume-Token" not in client.ws._response.headers
    client.vanish()
    await wait_until(lambda: len(server.registry) == 0, timeout=5)
    await client.close()


async def test_the_journal_is_bounded_and_a_gap_can_be_resynced(make_server: ServerFactory) -> None:
    server = await make_server(resume_journal_bytes=64 * 1024)
    first = await WsClient.connect(url(server))
    created = await start_answer(first)
    await first.wait_event("response.done", timeout=30)  # ~15 s of speech: far more than 64 KiB
    first.vanish()
    refused = await resume(server, created["session_id"], created["resume_token"], 0)
    assert (await refused.wait_event("error"))["error"]["code"] == "journal_gap"
    await refused.close()
    second = await resume(server, created["session_id"], created["resume_token"], 0, allow_resync=True)
    try:
        resync = await second.wait_event("session.resync_required")
        assert resync["reason"] == "journal_gap"
        await second.wait_event("session.resumed")
        stats = await server.registry.get(created["session_id"]).stats()  # type: ignore[union-attr]
        assert stats["journal_bytes"] <= 64 * 1024
    finally:
        await second.close()
        await first.close()


async def test_a_resume_socket_whose_first_message_is_no_resume_opens_a_new_session(
    make_server: ServerFactory,
) -> None:
    server = await make_server()
    client = await WsClient.connect(url(server, PATH + "&resume=1"))
    await client.send({"type": "session.update", "session": {"type": "realtime", "instructions": "Hi."}})
    await client.wait_event("session.created")
    updated = await client.wait_event("session.updated")
    assert updated["session"]["instructions"] == "Hi."
    await client.close()
    await asyncio.sleep(0)


async def test_the_old_token_works_until_the_client_speaks_on_the_new_socket(make_server: ServerFactory) -> None:
    """A resumed socket that drops before its client read session.resumed: the client still has
    only the old token, and may resume with it; once it speaks on a resumed socket, it may not."""
    server = await make_server()
    first = await WsClient.connect(url(server))
    created = await first.wait_event("session.created")
    session_id, old_token = created["session_id"], created["resume_token"]
    first.vanish()
    lost = await resume(server, session_id, old_token, 0)
    await lost.wait_event("session.resumed")
    lost.vanish()  # as if session.resumed never reached the client
    second = await resume(server, session_id, old_token, 0)
    try:
        resumed = await second.wait_event("session.resumed")
        await second.send({"type": "session.heartbeat"})  # the client speaks: the new token is confirmed
        await second.wait_event("session.heartbeat_ack")
        second.vanish()
        refused = await resume(server, session_id, old_token, 0)
        assert (await refused.wait_event("error"))["error"]["code"] == "invalid_resume_token"
        await refused.close()
        third = await resume(server, session_id, resumed["resume_token"], 0)
        assert (await third.wait_event("session.resumed"))["attachment_generation"] == 4
        await third.close()
    finally:
        for client in (first, lost, second):
            await client.close()
