"""Resume over WebRTC (issue 36): a session outlives a lost peer connection for --resume-grace, and a
new peer connection presenting the resume token takes it over, on /v1/rtc/offer (`kind: "resume"`),
a realtime call's `/resume` or a WHIP re-publish. Events go on numbered, each exactly once across the
two connections; the talker plays again what the lost peer did not hear. A goodbye ends the session at
once; a late resume or a rotated-out token is refused."""

from __future__ import annotations

import asyncio
from typing import Any

import numpy as np
import pytest
from aiortc import RTCPeerConnection, RTCSessionDescription
from yarl import URL

from rtc_omni.client.media import COLOURS, ColourVideoTrack, ToneAudioTrack
from rtc_omni.client.rtc_peers import RealtimeClient, SignalingError, UnderstandClient
from rtc_omni.engines import SyntheticEngine
from rtc_omni.pcm import TALKER_SAMPLE_RATE
from rtc_omni.signaling.ice import rtc_configuration
from rtc_omni.signaling.keys import DRAIN

from .conftest import ClientFactory, RunningServer, ServerFactory, http_json
from .generate_client import SMALL, received_through
from .generate_client import connect as connect_generate
from .waiting import wait_until
from .whip_client import SDP, http_raw, publisher_offer
from .wsclient import WsClient

pytestmark = pytest.mark.media

# A short grace, and a peer that sends nothing for a second is taken for lost.
RESUME = {"resume_grace": 2.0, "peer_silence_timeout": 1.0}
SPEECH_S = 3.0
FRAME_MS = 20  # what the client's recorder counts in


class SteadySpeechEngine(SyntheticEngine):
    """Speaks every answer as SPEECH_S of one steady tone: what a peer hears of it is easy to count."""

    def _speak(self, text: str) -> np.ndarray:
        t = np.arange(int(SPEECH_S * TALKER_SAMPLE_RATE)) / TALKER_SAMPLE_RATE
        return (0.3 * np.sin(2 * np.pi * 300 * t)).astype(np.float32)


class _Unplugged:
    """An ICE socket whose network is gone: it sends nothing, and is closed with its connection."""

    def __init__(self, socket: Any) -> None:
        self.socket = socket

    def sendto(self, *_args: Any) -> None:
        pass

    def close(self) -> None:
        self.socket.close()


def cut_network(pc: RTCPeerConnection) -> None:
    """The peer's network goes away under it: its ICE sockets send and receive nothing more, and no
    DTLS close ever reaches the server (the peer itself notices nothing for a while)."""
    ice_transports = {t.receiver.transport.transport for t in pc.getTransceivers()}
    if pc.sctp is not None:
        ice_transports.add(pc.sctp.transport.transport)
    for ice in ice_transports:
        for protocol in ice._connection._protocols:
            protocol.transport = _Unplugged(protocol.transport)
            protocol.datagram_received = lambda *_args: None


def seqs(events: list[dict[str, Any]]) -> list[int]:
    return [e["server_event_seq"] for e in events if "server_event_seq" in e]


async def offer_sdp() -> str:
    pc = RTCPeerConnection(rtc_configuration([]))
    pc.createDataChannel("control")
    await pc.setLocalDescription(await pc.createOffer())
    sdp = pc.localDescription.sdp
    await pc.close()
    return sdp


async def session_stats(server: RunningServer, client: UnderstandClient) -> dict[str, Any]:
    path = f"/v1/rtc/sessions/{client.session_id}"
    return (await http_json(server, "GET", path, headers=client.session_headers))[1]


async def test_a_new_peer_takes_over_mid_answer_and_gets_the_rest(
    make_server: ServerFactory, make_client: ClientFactory
) -> None:
    server = await make_server(spoken_sentences=1, **RESUME)
    old = await make_client(server, colour="red", tone=440.0, config={})
    await old.wait_event("video.frame.ack")
    first_token = old.resume_token
    old.send({"type": "video.query", "text": "What do you see?"})
    await old.wait_event("response.text.delta")
    given = old.last_event_seq
    new = UnderstandClient(server.url, video=ColourVideoTrack(COLOURS["red"], 320, 240, 30), audio=ToneAudioTrack())
    new.resume_token, new.last_event_seq = old.resume_token, given
    try:
        await new.connect(kind="resume", session_id=old.session_id)
        assert new.session_id == old.session_id and new.resume_token not in (None, first_token)
        replaced = await old.wait_event("session.replaced")
        assert replaced["attachment_generation"] == 2
        await wait_until(lambda: old.pc.connectionState == "closed", timeout=5)
        assert new.events[0]["type"] == "session.resumed" and new.events[0]["resume_token"] == new.resume_token
        await new.wait_event("response.audio.done", timeout=20)
        numbered = [s for s in seqs(old.events) if s <= given] + seqs(new.events)
        assert numbered == list(range(1, len(numbered) + 1))  # none lost, none twice
        stats = await session_stats(server, old)  # its session token opens the stats
        assert stats["attached"] and stats["resumes"] == 1 and stats["journal_bytes"] > 0
    finally:
        await new.close()


@pytest.mark.parametrize(
    ("cut", "silence_timeout"),
    [
        ("mid-speech", 1.0),
        ("at the answer's start", 1.0),
        ("mid-speech", 3.0),  # the talker is parked on suspicion (2 s quiet) before the loss is declared
    ],
)
async def test_a_peer_lost_without_a_goodbye_resumes_and_hears_the_whole_answer(
    make_server: ServerFactory, make_client: ClientFactory, cut: str, silence_timeout: float
) -> None:
    engine = SteadySpeechEngine(0.05, 200.0, 8.0, "tone")  # generated 8x faster than it is spoken
    server = await make_server(engine=engine, **{**RESUME, "peer_silence_timeout": silence_timeout})
    client = await make_client(server, colour="red", tone=440.0, config={})
    await client.wait_event("video.frame.ack")
    mark = len(client.events)
    client.send({"type": "video.query", "text": "Talk to me."})
    await client.wait_event("response.start", after=mark)
    if cut == "mid-speech":
        await wait_until(lambda: client.recorder is not None and client.recorder.voiced_frames() >= 50)  # 1 s
    cut_network(client.pc)
    await wait_until(lambda: not server.registry.get(client.session_id).resumable.attached, timeout=5)
    await asyncio.sleep(0.5)  # the whole answer is generated while nobody listens
    lost_at = len(client.events)

    await client.resume()

    await client.wait_event("response.audio.done", after=mark, timeout=15)
    talker = server.registry.get(client.session_id).outgoing
    await wait_until(lambda: talker.buffered_ms == 0, timeout=5)  # what was played again, too
    await asyncio.sleep(0.5)  # its last packets play out
    assert client.recorder is not None
    heard_ms = client.recorder.voiced_frames() * FRAME_MS
    assert SPEECH_S * 1000 - 200 <= heard_ms <= SPEECH_S * 1000 + 1000  # all of it, at most ~1 s twice
    kinds = [e["type"] for e in client.events[lost_at:]]
    assert kinds[0] == "session.resumed" and "response.audio.done" in kinds
    if cut != "mid-speech":
        assert "response.text.done" in kinds  # journaled while detached, replayed on the new connection
    assert seqs(client.events) == list(range(1, client.last_event_seq + 1))
    assert client.resumes == 1 and client.ended is None


async def test_a_resume_after_the_grace_is_refused(make_server: ServerFactory, make_client: ClientFactory) -> None:
    server = await make_server(**RESUME)
    client = await make_client(server, colour=None, tone=440.0)
    cut_network(client.pc)
    await wait_until(lambda: len(server.registry) == 0, timeout=10)  # silence, then the grace, ran out
    with pytest.raises(SignalingError) as refused:
        await client.resume()
    assert refused.value.status == 404 and refused.value.body["code"] == "session_resume_expired"


async def test_a_rotated_out_token_and_a_gap_are_refused(server: RunningServer, make_client: ClientFactory) -> None:
    client = await make_client(server, colour=None, tone=None)
    spent = client.resume_token
    await client.resume()
    assert client.resume_token not in (None, spent) and client.resumes == 1
    offer = {"type": "offer", "sdp": await offer_sdp(), "kind": "resume", "session_id": client.session_id}
    status, body = await http_json(server, "POST", "/v1/rtc/offer", json={**offer, "resume_token": spent})
    assert status == 401 and body["code"] == "invalid_resume_token"
    unknown = {**offer, "resume_token": client.resume_token, "last_received_server_event_seq": 10**6}
    status, body = await http_json(server, "POST", "/v1/rtc/offer", json=unknown)  # events it cannot have had
    assert status == 409 and body["code"] == "journal_gap"
    stats = await session_stats(server, client)
    assert stats["resumes"] == 1 and stats["attached"]  # neither refusal touched the session


async def test_the_client_resumes_by_itself_and_a_draining_server_lets_it(
    make_server: ServerFactory, make_client: ClientFactory
) -> None:
    server = await make_server(resume_grace=10.0, peer_silence_timeout=1.0)
    client = await make_client(server, colour="red", tone=440.0, config={"modalities": ["text"]}, auto_resume=True)
    server.app[DRAIN].start()  # no new session, but a resume opens none
    cut_network(client.pc)
    await wait_until(lambda: client.resumes == 1, timeout=15)  # it noticed the silence, and resumed
    await client.wait_event("video.frame.ack", after=len(client.events))  # the camera, on the new connection
    result = await client.ask("Still there?")
    assert result.text and not result.errors and client.ended is None


async def test_a_peer_that_closes_its_connection_ends_the_session_at_once(
    server: RunningServer, make_client: ClientFactory
) -> None:
    client = await make_client(server, colour="red", tone=440.0)  # resumable for the default 30 s
    await client.pc.close()  # a DTLS close: a goodbye
    await wait_until(lambda: client.session_id not in server.registry, timeout=5)


async def test_a_realtime_call_resumes_through_its_resume_url(server: RunningServer) -> None:
    call = RealtimeClient(server.url, video=None, audio=None, receive_audio=False)
    try:
        await call.connect()
        created = await call.wait_event("session.created")
        spent = call.resume_token
        assert created["resume_token"] == spent and created["attachment_generation"] == 1
        await call.resume()
        resumed = await call.wait_event("session.resumed")
        assert resumed["session_id"] == call.session_id and resumed["resume_token"] == call.resume_token != spent
        question = {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Hello?"}]}
        call.send({"type": "conversation.item.create", "item": question})
        call.send({"type": "response.create"})
        await call.wait_event("response.done")
        assert seqs(call.events) == list(range(1, call.last_event_seq + 1))
    finally:
        await call.close()


async def test_a_whip_publisher_republishes_on_a_new_connection(server: RunningServer) -> None:
    first, offer = await publisher_offer(audio=False)
    second, again = await publisher_offer(audio=False)
    try:
        status, headers, answer = await http_raw(server, "POST", "/whip", data=offer, headers=SDP)
        assert status == 201
        await first.setRemoteDescription(RTCSessionDescription(sdp=answer, type="answer"))
        await wait_until(lambda: first.connectionState == "connected")
        location, token = headers["Location"], headers["Resume-Token"]
        stale = {**SDP, "Resume-Token": "not-the-token"}
        assert (await http_raw(server, "POST", location, data=again, headers=stale))[0] == 401

        status, renewed, answer = await http_raw(
            server, "POST", location, data=again, headers={**SDP, "Resume-Token": token}
        )
        assert status == 201 and renewed["Location"] == location
        assert renewed["ETag"] != headers["ETag"] and renewed["Resume-Token"] != token
        await second.setRemoteDescription(RTCSessionDescription(sdp=answer, type="answer"))
        await wait_until(lambda: second.connectionState == "connected")
        await wait_until(lambda: first.connectionState == "closed", timeout=5)  # the old one was replaced
        path = URL(location).path.replace("/whip/", "/v1/rtc/sessions/")
        auth = {"Authorization": f"Bearer {headers['Session-Token']}"}
        before = (await http_json(server, "GET", path, headers=auth))[1]
        await asyncio.sleep(1.0)
        after = (await http_json(server, "GET", path, headers=auth))[1]
        assert after["resumes"] == 1 and after["frames_received"] > before["frames_received"]  # from the new one
    finally:
        await first.close()
        await second.close()


async def test_a_generation_taken_over_mid_stream_goes_on_on_the_new_connection(make_server: ServerFactory) -> None:
    """The old and the new connection never encode the same generated frames (two encoder threads
    reformatting one PyAV frame crashed the server): the video moves to the new one and completes."""
    server = await make_server(synthetic_chunk_frames=24, **RESUME)
    client = await connect_generate(server)
    try:
        await client.start(prompt="a red square", fps=24, num_frames=144, **SMALL)
        await wait_until(lambda: client.receiver is not None and len(client.receiver.frames) >= 24, timeout=10)
        for _ in range(3):  # each resume a takeover of a connection that is still sending
            await client.resume()
            before = len(client.receiver.frames) if client.receiver else 0
            await wait_until(lambda n=before: client.receiver is not None and len(client.receiver.frames) > n + 5)
        done = await client.wait_event("session.done", timeout=30)
        assert done["frames"] == 144 and done["stopped"] is False
        frames = await received_through(client.receiver, 143)
        assert frames[-1].index == 143 and client.resumes == 3
        red = frames[-1].mean_rgb
        assert red[0] > red[1] + 60 and red[0] > red[2] + 60
    finally:
        await client.close()


async def test_bad_resume_requests_get_a_4xx_or_an_error_and_the_call_goes_on(server: RunningServer) -> None:
    """Every new way in, given hostile or malformed input: a clear 4xx or `error`, never a 500; the
    call it names is still there and resumable."""
    call = RealtimeClient(server.url, video=None, audio=None)
    await call.connect()
    socket = await WsClient.connect(server.url.replace("http", "ws") + "/v1/realtime?model=synthetic")
    try:
        call_id, token = str(call.session_id), str(call.resume_token)
        ws_session = (await socket.wait_event("session.created"))["session_id"]
        offer = await offer_sdp()
        publisher, published = await publisher_offer(audio=False)
        await publisher.close()
        resume = {"type": "offer", "sdp": offer, "kind": "resume", "session_id": call_id}
        given = {**SDP, "Resume-Token": token}
        calls = f"/v1/realtime/calls/{call_id}/resume"
        cases: list[tuple[str, dict[str, Any], int]] = [
            ("/v1/rtc/offer", {"json": resume}, 400),  # no token
            ("/v1/rtc/offer", {"json": {**resume, "resume_token": "x" * 100_000}}, 401),
            ("/v1/rtc/offer", {"json": {**resume, "resume_token": token, "last_received_server_event_seq": -1}}, 400),
            ("/v1/rtc/offer", {"json": {**resume, "resume_token": token, "session_id": 7}}, 400),
            ("/v1/rtc/offer", {"json": {**resume, "resume_token": token, "session_id": "nope"}}, 404),
            ("/v1/rtc/offer", {"json": {**resume, "resume_token": token, "session_id": ws_session}}, 409),
            (calls, {"data": offer}, 415),
            (calls, {"data": offer, "headers": SDP}, 401),
            (calls, {"data": offer, "headers": {**SDP, "Resume-Token": "x" * 4000}}, 401),
            (calls, {"data": offer, "headers": {**given, "Last-Event-Seq": "9" * 5000}}, 400),
            (calls, {"data": offer, "headers": {**given, "Last-Event-Seq": "-3"}}, 400),
            (calls, {"data": "v=0 garbage", "headers": given}, 400),
            ("/v1/realtime/calls/nope/resume", {"data": offer, "headers": given}, 404),
            (f"/whip/{call_id}", {"data": offer, "headers": given}, 422),  # no track to publish
            (f"/whip/{call_id}", {"data": published, "headers": given}, 409),  # not a publisher's session
            ("/whip/nope", {"data": published, "headers": given}, 404),
        ]
        for path, kwargs, expected in cases:
            status, body = await http_json(server, "POST", path, **kwargs)
            assert status == expected, (path, status, body)
        for bad in (
            {"type": "session.resume", "session_id": ws_session},  # no token
            {
                "type": "session.resume",
                "session_id": ws_session,
                "resume_token": "t",
                "last_received_server_event_seq": "one",
            },
            {"type": "session.resume", "session_id": ["x"], "resume_token": "t"},
        ):
            refused = await WsClient.resume_with(server.url.replace("http", "ws") + "/v1/realtime", bad)
            assert (await refused.wait_event("error"))["error"]["code"] == "invalid_session_resume"
            await refused.wait_closed()
            await refused.close()
        await call.resume()  # the call, refused all that, still resumes with its token
        assert call.resumes == 1
    finally:
        await socket.close()
        await call.close()
