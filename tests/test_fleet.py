"""A fleet of gateways: two `rtc-omni serve` processes on 127.0.0.1 with their own node ids and one
cluster key. A request for one gateway's session or key, sent to the other, reaches its owner; a
request signed with another key, or forged by a client, is refused and goes nowhere. A draining
gateway refuses new sessions while its live ones finish, then exits 0."""

from __future__ import annotations

import asyncio
import re
import secrets
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import aiohttp
import pytest
from aiortc import RTCPeerConnection

from rtc_omni.client.rtc_peers import RealtimeClient, UnderstandClient
from rtc_omni.config import SettingsError, load_settings
from rtc_omni.fleet import Fleet
from rtc_omni.fleet.signatures import SIGNATURE_HEADER, signature
from rtc_omni.signaling.ice import rtc_configuration

from .serve_process import Served, call, mint_key, open_realtime, start_serve
from .tools import free_port, require_tool
from .waiting import wait_until
from .whep_player import WhepPlayer, viewing
from .wsclient import WsClient

CLUSTER_KEY = secrets.token_hex(32)
HAPROXY_CONFIG = Path(__file__).resolve().parent.parent / "loadbalancer" / "haproxy.cfg"


class Gateways:
    """Gateways of one fleet on 127.0.0.1, started one by one, each with its log `NODE.log`."""

    def __init__(self, tmp_path: Path) -> None:
        self.tmp_path = tmp_path
        self.gateways: list[Served] = []

    def start(self, node: str, *flags: str, key: str = CLUSTER_KEY) -> Served:
        served = start_serve(self.tmp_path, "--node-id", node, "--cluster-key", key, *flags, name=node)
        self.gateways.append(served)
        return served

    def stop(self) -> None:
        for served in self.gateways:
            if served.process.poll() is None:
                served.process.kill()
                served.process.wait()


class Fleet2(Gateways):
    """Gateway n0, and gateway n1 that lists n0 as its peer."""

    def __init__(self, tmp_path: Path, *n0_flags: str) -> None:
        super().__init__(tmp_path)
        self.n0 = self.start("n0", *n0_flags)
        self.n1 = self.start("n1", "--peer", f"n0={self.n0.url}")


@pytest.fixture
def fleet(tmp_path: Path) -> Iterator[Fleet2]:
    gateways = Fleet2(tmp_path)
    yield gateways
    gateways.stop()


def realtime_call(url: str, receive_audio: bool = False) -> RealtimeClient:
    """A realtime call without a camera or microphone: a text turn needs neither."""
    return RealtimeClient(url, video=None, audio=None, receive_audio=receive_audio)


@pytest.mark.media
async def test_a_call_made_on_one_gateway_is_watched_and_hung_up_through_the_other(fleet: Fleet2) -> None:
    caller = realtime_call(fleet.n0.url, receive_audio=True)  # the answer's voice, which a viewer hears too
    player = WhepPlayer("audio")
    try:
        await caller.connect()
        call_id = str(caller.session_id)
        assert call_id.startswith("n0.")
        stats = f"/v1/rtc/sessions/{call_id}"
        assert await call("GET", fleet.n1.url + stats, caller.view_token) == 200
        await player.play(fleet.n1, call_id, viewing(caller))  # n0 answers, through n1
        assert player.location.startswith(fleet.n1.url)  # the viewer's resource, as the client reached it
        question = {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Hello?"}]}
        caller.send({"type": "conversation.item.create", "item": question})
        caller.send({"type": "response.create"})
        assert player.audio is not None
        recorder = player.audio
        await wait_until(lambda: any(frame.rms >= recorder.SILENCE_RMS for frame in recorder.frames), timeout=20)
        hang_up = f"{fleet.n1.url}/v1/realtime/calls/{call_id}/hangup"
        assert await call("POST", hang_up, caller.view_token) == 403  # a viewer cannot end it
        assert await call("POST", hang_up, caller.session_token) == 200
        assert await call("GET", fleet.n0.url + stats, caller.view_token) == 404
    finally:
        await player.close()
        await caller.close()
    for served in fleet.gateways:  # the secret is in no log line
        assert CLUSTER_KEY not in served.log.read_text()


async def test_a_websocket_session_is_resumed_through_the_other_gateway(fleet: Fleet2) -> None:
    path = "/v1/realtime?model=synthetic"
    first = await WsClient.connect(fleet.n0.url.replace("http", "ws") + path)
    created = await first.wait_event("session.created")
    assert created["session_id"].startswith("n0.")
    first.vanish()
    second = await WsClient.resume(
        fleet.n1.url.replace("http", "ws") + path, created["session_id"], created["resume_token"], 0
    )
    try:
        resumed = await second.wait_event("session.resumed")  # n0 answers, through n1
        assert resumed["attachment_generation"] == 2
        await second.send({"type": "session.update", "session": {"type": "realtime", "instructions": "Hi."}})
        assert (await second.wait_event("session.updated"))["server_event_seq"] == 1
        await second.send({"type": "session.close"})
        await second.wait_closed()
        assert second.ws.close_code == 1000
        async with aiohttp.ClientSession() as http:  # session.close ended it on n0

            async def open_on_n0() -> int:
                async with http.get(f"{fleet.n0.url}/healthz") as answer:
                    return int((await answer.json())["sessions"])

            async with asyncio.timeout(5):
                while await open_on_n0():
                    await asyncio.sleep(0.1)
    finally:
        await second.close()
        await first.close()


@pytest.mark.media
async def test_a_controller_attaches_through_the_other_gateway(fleet: Fleet2) -> None:
    session = UnderstandClient(fleet.n0.url, video=None, audio=None)
    await session.connect()
    controller = UnderstandClient(fleet.n1.url, video=None, audio=None, token=session.session_token)
    try:
        await controller.connect(kind="control", session_id=session.session_id)  # the id is in the offer's body
        controller.send("{broken")  # answered by n0's session, on the controller's own channel
        assert controller.session_id == session.session_id
        assert (await controller.wait_event("error"))["message"] == "Invalid JSON in session.config"
    finally:
        await controller.close()
        await session.close()


@pytest.mark.media
async def test_a_key_minted_on_one_gateway_opens_one_session_through_the_other(fleet: Fleet2) -> None:
    key = await mint_key(fleet.n0.url, "Minted on n0.")
    assert key.startswith("ek_n0.")
    assert await open_realtime(fleet.n1.url, key) == "session.created: Minted on n0."
    assert await open_realtime(fleet.n1.url, key) == 401
    assert await open_realtime(fleet.n0.url, key) == 401


@pytest.mark.media
async def test_a_request_not_signed_with_the_cluster_key_is_refused_and_goes_nowhere(fleet: Fleet2) -> None:
    stranger = fleet.start("n2", "--peer", f"n0={fleet.n0.url}", key=secrets.token_hex(32))  # another fleet's key
    caller = realtime_call(fleet.n0.url)
    try:
        await caller.connect()
        session = f"/v1/rtc/sessions/{caller.session_id}"
        assert await call("DELETE", stranger.url + session, caller.session_token) == 403  # refused by n0
        forged = {SIGNATURE_HEADER: f"n0 {int(time.time())} not-a-signature"}
        assert await call("DELETE", fleet.n1.url + session, caller.session_token, forged) == 403  # by n1
        assert await call("GET", fleet.n0.url + session, caller.view_token) == 200  # the call goes on
        assert fleet.n0.log.read_text().count("refused DELETE") == 1
        assert fleet.n1.log.read_text().count("refused DELETE") == 1
        # Signed with the right key, a request is never forwarded again: n1 does not pass it to n0.
        fleet_key = Fleet.of(load_settings(environ={"RTC_OMNI_NODE_ID": "n2", "RTC_OMNI_CLUSTER_KEY": CLUSTER_KEY}))
        assert fleet_key is not None and fleet_key.request_key is not None
        signed = {SIGNATURE_HEADER: signature(fleet_key.request_key, "n2", "DELETE", session)}
        assert await call("DELETE", fleet.n1.url + session, caller.session_token, signed) == 404
        assert await call("GET", fleet.n0.url + session, caller.view_token) == 200
        deletes = re.findall(rf'"DELETE {re.escape(session)} HTTP/1.1" (\d+)', fleet.n0.log.read_text())
        assert deletes == ["403"]  # n0 saw n2's, and refused it; neither n1's refusals nor its 404
    finally:
        await caller.close()


@pytest.mark.media
async def test_a_peer_reaches_every_worker_of_a_gateway_for_its_calls_and_keys(tmp_path: Path) -> None:
    fleet = Fleet2(tmp_path, "--workers", "2")  # n1 reaches n0 on any worker, which passes it on to the owner
    calls: list[RealtimeClient] = []
    try:
        while {str(c.session_id)[:6] for c in calls} != {"n0.w0.", "n0.w1."}:
            assert len(calls) < 16, "every call went to one worker"
            calls.append(realtime_call(fleet.n0.url))
            await calls[-1].connect()
        keys: list[str] = []
        while {key[:9] for key in keys} != {"ek_n0.w0.", "ek_n0.w1."}:
            assert len(keys) < 16, f"every key came from one worker: {keys}"
            keys.append(await mint_key(fleet.n0.url, f"Key {len(keys)}."))
        for number, key in enumerate(keys):
            assert await open_realtime(fleet.n1.url, key) == f"session.created: Key {number}."
            assert await open_realtime(fleet.n1.url, key) == 401
        for live in calls:
            stats = f"{fleet.n1.url}/v1/rtc/sessions/{live.session_id}"
            assert [await call("GET", stats, live.view_token) for _ in range(4)] == [200] * 4
            hang_up = f"{fleet.n1.url}/v1/realtime/calls/{live.session_id}/hangup"
            assert await call("POST", hang_up, live.session_token) == 200
            assert await call("GET", stats, live.view_token) == 404
    finally:
        await asyncio.gather(*(live.close() for live in calls))
        fleet.stop()


async def health(url: str) -> tuple[int, str]:
    """GET /healthz: its status code and `status`."""
    async with aiohttp.ClientSession() as http, http.get(f"{url}/healthz") as response:
        return response.status, str((await response.json())["status"])


async def health_becomes(url: str, expected: tuple[int, str]) -> bool:
    """Whether /healthz answers `expected` within 5 s (a signal is handled at once, but not before the
    call; a balancer just started may not listen yet)."""
    for _ in range(100):
        try:
            if await health(url) == expected:
                return True
        except aiohttp.ClientConnectionError:
            pass
        await asyncio.sleep(0.05)
    return False


async def offer_a_call(url: str) -> tuple[int, str | None]:
    """POST /v1/realtime/calls with an aiortc offer: the status and Retry-After of the answer."""
    pc = RTCPeerConnection(rtc_configuration([]))
    try:
        pc.addTransceiver("audio")
        await pc.setLocalDescription(await pc.createOffer())
        sdp = {"Content-Type": "application/sdp"}
        async with aiohttp.ClientSession() as http:
            async with http.post(f"{url}/v1/realtime/calls", data=pc.localDescription.sdp, headers=sdp) as answer:
                return answer.status, answer.headers.get("Retry-After")
    finally:
        await pc.close()


async def answered(caller: RealtimeClient, question: str) -> str:
    """Ask a text question on the call: the answer's status."""
    item = {"type": "message", "role": "user", "content": [{"type": "input_text", "text": question}]}
    caller.send({"type": "conversation.item.create", "item": item})
    mark = len(caller.events)
    caller.send({"type": "response.create", "response": {"output_modalities": ["text"]}})
    return str((await caller.wait_event("response.done", after=mark, timeout=20))["response"]["status"])


@pytest.mark.media
async def test_a_draining_gateway_refuses_new_sessions_while_a_live_call_finishes_then_exits_0(fleet: Fleet2) -> None:
    caller = realtime_call(fleet.n0.url)
    try:
        await caller.connect()
        key = await mint_key(fleet.n0.url, "Minted before the drain.")
        fleet.n0.process.send_signal(signal.SIGUSR2)
        assert await health_becomes(fleet.n0.url, (503, "draining"))
        assert await offer_a_call(fleet.n0.url) == (503, "5")
        assert await call("POST", f"{fleet.n0.url}/v1/realtime/client_secrets", None) == 503
        assert await open_realtime(fleet.n1.url, key) == "session.created: Minted before the drain."
        assert await health(fleet.n1.url) == (200, "ok")  # the rest of the fleet takes the new calls
        assert await answered(caller, "Still there?") == "completed"  # the live call goes on
        stats = f"/v1/rtc/sessions/{caller.session_id}"
        assert await call("GET", fleet.n1.url + stats, caller.view_token) == 200  # reached through n1 too
        assert fleet.n0.process.poll() is None
        hang_up = f"{fleet.n1.url}/v1/realtime/calls/{caller.session_id}/hangup"
        assert await call("POST", hang_up, caller.session_token) == 200
        assert fleet.n0.process.wait(timeout=20) == 0  # its last call ended: it exits
    finally:
        await caller.close()
    log = fleet.n0.log.read_text()
    assert "draining: refusing new sessions; exiting once the 1 open end" in log
    assert "drained: every session ended" in log


@pytest.mark.media
async def test_the_admin_endpoint_drains_a_server_that_has_a_token_and_the_drain_timeout_bounds_it(
    tmp_path: Path,
) -> None:
    served = start_serve(tmp_path, "--auth-token", "s3cret", "--drain-timeout", "1")
    caller = RealtimeClient(served.url, video=None, audio=None, receive_audio=False, token="s3cret")
    try:
        await caller.connect()
        drain = f"{served.url}/v1/admin/drain"
        assert await call("POST", drain, None) == 401
        assert await call("POST", drain, caller.session_token) == 401  # a session's token opens no admin route
        assert await call("POST", drain, "s3cret") == 202
        assert served.process.wait(timeout=20) == 0  # the call did not end: closed after 1 s
        assert "drain timeout: closing the 1 sessions still open" in served.log.read_text()
    finally:
        await caller.close()
        if served.process.poll() is None:
            served.process.kill()
            served.process.wait()
    open_server = start_serve(tmp_path, name="open")
    try:
        assert await call("POST", f"{open_server.url}/v1/admin/drain", None) == 403
        assert await health(open_server.url) == (200, "ok")
    finally:
        open_server.process.kill()
        open_server.process.wait()


@pytest.mark.parametrize(
    ("environ", "message"),
    [
        ({"RTC_OMNI_NODE_ID": "w1"}, "--node-id (RTC_OMNI_NODE_ID): a lower-case letter"),
        ({"RTC_OMNI_NODE_ID": "n0", "RTC_OMNI_PEER": "n1=http://127.0.0.1:9"}, "--peer needs --node-id"),
        ({"RTC_OMNI_PEER": "n1:8080"}, "'n1:8080' is not NODE=http://HOST:PORT"),
        ({"RTC_OMNI_CLUSTER_KEY": "short-secret"}, "--cluster-key must be at least 32 characters"),
    ],
)
def test_unusable_fleet_settings_are_refused_with_the_reason(environ: dict[str, str], message: str) -> None:
    with pytest.raises(SettingsError, match=re.escape(message)) as raised:
        load_settings(environ=environ)
    assert "short-secret" not in str(raised.value)


def test_every_gateway_can_be_given_the_same_peer_list() -> None:
    peers = "n0=http://gw0.internal:8080,n1=http://gw1.internal:8080/"
    settings = load_settings(
        environ={"RTC_OMNI_NODE_ID": "n1", "RTC_OMNI_PEER": peers, "RTC_OMNI_CLUSTER_KEY": CLUSTER_KEY}
    )
    assert settings.peers == {"n0": "http://gw0.internal:8080"}


def haproxy_config(port: int, gateways: dict[str, int]) -> str:
    """loadbalancer/haproxy.cfg, listening on 127.0.0.1:`port` without TLS, in front of `gateways` on loopback."""
    text = re.sub(r"^(\s*)bind .*$", rf"\1bind 127.0.0.1:{port}", HAPROXY_CONFIG.read_text(), flags=re.M)
    for node, gateway_port in gateways.items():
        text, found = re.subn(rf"^(\s*server {node}) \S+", rf"\1 127.0.0.1:{gateway_port}", text, flags=re.M)
        assert found == 1, node
    return text


@pytest.mark.media
async def test_behind_haproxy_every_call_is_served_and_a_draining_gateway_cuts_none(tmp_path: Path) -> None:
    haproxy = require_tool("haproxy", "apt-get install haproxy")
    ports = {"n0": free_port(), "n1": free_port()}
    fleet = Gateways(tmp_path)
    served = {
        node: fleet.start(node, "--port", str(ports[node]), "--peer", f"{peer}=http://127.0.0.1:{ports[peer]}")
        for node, peer in (("n0", "n1"), ("n1", "n0"))
    }
    config = tmp_path / "haproxy.cfg"
    config.write_text(haproxy_config(lb_port := free_port(), ports))
    balancer = subprocess.Popen([haproxy, "-db", "-f", str(config)], stderr=(tmp_path / "haproxy.log").open("w"))
    lb = f"http://127.0.0.1:{lb_port}"
    calls: list[RealtimeClient] = []
    try:
        assert await health_becomes(lb, (200, "ok"))
        calls.append(realtime_call(lb))
        await calls[0].connect()
        live = calls[0]
        stats = f"{lb}/v1/rtc/sessions/{live.session_id}"
        assert [await call("GET", stats, live.view_token) for _ in range(8)] == [200] * 8  # on either gateway
        owner = str(live.session_id)[:2]
        other, draining = "n1" if owner == "n0" else "n0", served[owner]
        draining.process.send_signal(signal.SIGUSR2)
        assert await health_becomes(draining.url, (503, "draining"))
        for _ in range(4):  # the balancer sends new calls to the other gateway only (or retries a 503 there)
            calls.append(realtime_call(lb))
            await calls[-1].connect()
            assert str(calls[-1].session_id).startswith(f"{other}.")
        assert await answered(live, "Still there?") == "completed"  # the live call goes on
        assert await call("POST", f"{lb}/v1/realtime/calls/{live.session_id}/hangup", live.session_token) == 200
        assert draining.process.wait(timeout=20) == 0
    finally:
        await asyncio.gather(*(c.close() for c in calls))
        balancer.terminate()
        balancer.wait(timeout=10)
        fleet.stop()
