"""`rtc-omni serve --workers N`: workers share the port, and every session's routes reach the worker
that owns it, whichever worker the kernel hands the connection to; one --max-sessions across them;
a scrape of /metrics and /healthz on any worker count them all; a dead worker ends only its own
sessions and is restarted, unless it keeps dying at start. The engine process of `--engine vllm
--workers N` (here serving the synthetic engine; tests/test_vllm_cpu_workers.py runs the real one)."""

from __future__ import annotations

import asyncio
import functools
import importlib.util
import json
import os
import re
import signal
import time
import urllib.error
import urllib.request
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path

import aiohttp
import pytest

from rtc_omni.client.rtc_peers import ControlClient, RealtimeClient, SignalingError, UnderstandClient
from rtc_omni.config import SettingsError, load_settings
from rtc_omni.workers.engine_process import EngineProcess, EngineStartError, engine_settings, remote_settings
from rtc_omni.workers.supervisor import worker_settings

from .prometheus_text import Samples, parsed
from .serve_process import Served, call, mint_key, open_realtime, start_serve
from .whep_player import WhepPlayer, viewing
from .wsclient import WsClient

MAX_CLIENTS = 16  # sessions opened until both workers own one (each lands on either: 2^-15 to miss)
ROUNDS = 8  # calls per session, each on a new connection, so the kernel picks a worker each time


def start_workers(tmp_path: Path, *args: str) -> Served:
    """`rtc-omni serve --workers 2 --port 0 ARGS`, once its banner (printed when both listen) is out."""
    return start_serve(tmp_path, "--workers", "2", *args)


@pytest.fixture
def served(tmp_path: Path) -> Iterator[Served]:
    server = start_workers(tmp_path)
    yield server
    if server.process.poll() is None:
        server.process.kill()
        server.process.wait()


def owner(session_id: str) -> str:
    return session_id.split(".", 1)[0]


async def open_sessions_on_both_workers(url: str, token: str | None = None) -> AsyncIterator[UnderstandClient]:
    """Control-only clients (no media to encode), until both w0 and w1 own at least one."""
    owners: set[str] = set()
    for _ in range(MAX_CLIENTS):
        client = UnderstandClient(url, video=None, audio=None, token=token)
        await client.connect()
        assert client.session_id is not None
        owners.add(owner(client.session_id))
        yield client
        if owners == {"w0", "w1"}:
            return
    raise AssertionError(f"{MAX_CLIENTS} sessions all went to {owners}")


@pytest.mark.media
async def test_every_session_route_reaches_the_worker_that_owns_it(served: Served) -> None:
    clients = [client async for client in open_sessions_on_both_workers(served.url)]
    try:
        for client in clients:
            session = f"{served.url}/v1/rtc/sessions/{client.session_id}"
            assert [await call("GET", session, client.view_token) for _ in range(ROUNDS)] == [200] * ROUNDS
        # Attaching a controller names the session in the offer's body, not the path.
        for one_of_worker in {owner(c.session_id or ""): c for c in clients}.values():
            for _ in range(3):
                controller = UnderstandClient(served.url, video=None, audio=None, token=one_of_worker.session_token)
                try:
                    await controller.connect(kind="control", session_id=one_of_worker.session_id)
                finally:
                    await controller.close()
            # So does a resume, which names the session in its body too.
            for _ in range(3):
                await one_of_worker.resume()
            # A WHEP player's offer and its viewer resource (Location) reach the owner too.
            player = WhepPlayer("audio")
            try:
                await player.play(served, str(one_of_worker.session_id), viewing(one_of_worker))
                assert await call("DELETE", player.location, one_of_worker.session_token) == 200
            finally:
                await player.close()
        for client in clients:
            session = f"{served.url}/v1/rtc/sessions/{client.session_id}"
            assert await call("DELETE", session, client.session_token) == 200
            assert [await call("GET", session, client.view_token) for _ in range(ROUNDS)] == [404] * ROUNDS
    finally:
        await asyncio.gather(*(client.close() for client in clients))
    served.process.send_signal(signal.SIGTERM)
    assert served.process.wait(timeout=30) == 0


async def test_a_websocket_session_is_resumed_on_whichever_worker_the_socket_lands(tmp_path: Path) -> None:
    """Each resume socket lands on either worker (SO_REUSEPORT): one on the sibling is relayed to the
    owner, with the client's credentials (the server has a token)."""
    served = start_workers(tmp_path, "--auth-token", "workers-resume-token")
    auth = {"Authorization": "Bearer workers-resume-token"}
    url = served.url.replace("http", "ws") + "/v1/realtime?model=synthetic"
    sockets: list[WsClient] = []
    owners: set[str] = set()
    try:
        while owners != {"w0", "w1"}:
            assert len(sockets) < MAX_CLIENTS
            sockets.append(await WsClient.connect(url, auth))
            created = await sockets[-1].wait_event("session.created")
            if owner(created["session_id"]) in owners:
                continue
            owners.add(owner(created["session_id"]))
            token, seq = created["resume_token"], 0
            for _ in range(ROUNDS // 2):
                sockets[-1].vanish()
                sockets.append(await WsClient.resume(url, created["session_id"], token, seq, auth))
                resumed = await sockets[-1].wait_event("session.resumed")
                token = resumed["resume_token"]
                await sockets[-1].send({"type": "session.update", "session": {"type": "realtime"}})
                await sockets[-1].wait_event("session.updated")
                seq = sockets[-1].last_seq
    finally:
        await asyncio.gather(*(socket.close() for socket in sockets))
        served.process.kill()
        served.process.wait()


async def keys_from_both_workers(url: str) -> list[str]:
    """Ephemeral keys, the one numbered N with the instructions `Key N.`, until both workers minted one."""
    keys: list[str] = []
    while {key[:5] for key in keys} != {"ek_w0", "ek_w1"}:
        assert len(keys) < MAX_CLIENTS, f"every key came from one worker: {keys}"
        keys.append(await mint_key(url, f"Key {len(keys)}."))
    return keys


@pytest.mark.media
async def test_an_ephemeral_key_opens_one_session_whichever_worker_minted_it(served: Served) -> None:
    keys = await keys_from_both_workers(served.url)
    for number, key in enumerate(keys):  # each on a new connection: usually another worker than the minter
        assert await open_realtime(served.url, key) == f"session.created: Key {number}."
        assert await open_realtime(served.url, key) == 401


async def scrape(url: str, token: str) -> Samples:
    """GET /metrics on a new connection (either worker may take it)."""
    headers = {"Authorization": f"Bearer {token}"}
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(force_close=True)) as http:
        async with http.get(f"{url}/metrics", headers=headers) as response:
            assert response.status == 200
            return parsed(await response.text())


def total(samples: Samples, name: str, **labels: str) -> float:
    """The sum of `name`'s samples that carry `labels`."""
    wanted = set(labels.items())
    return sum(value for (sample, carried), value in samples.items() if sample == name and wanted <= set(carried))


@pytest.mark.media
async def test_metrics_scraped_on_any_worker_count_every_workers_sessions(tmp_path: Path) -> None:
    server = start_workers(tmp_path, "--auth-token", "s3cret")
    clients: list[UnderstandClient] = []
    try:
        async for client in open_sessions_on_both_workers(server.url, "s3cret"):
            clients.append(client)
            client.send("{broken")  # an error event, counted by the worker that owns the session
            await client.wait_event("error")
        for _ in range(ROUNDS):
            samples = await scrape(server.url, "s3cret")
            assert total(samples, "rtc_omni_sessions", kind="understand") == len(clients)
            assert total(samples, "rtc_omni_errors_total", kind="understand") == len(clients)
            workers = {dict(labels)["worker"] for name, labels in samples if name == "process_resident_memory_bytes"}
            assert workers == {"0", "1"}
            assert samples[("rtc_omni_workers_missing", ())] == 0
        assert [await call("GET", f"{server.url}/metrics", None) for _ in range(ROUNDS)] == [401] * ROUNDS
    finally:
        await asyncio.gather(*(client.close() for client in clients))
        server.process.kill()
        server.process.wait()


@pytest.mark.media
async def test_max_sessions_counts_the_sessions_of_every_worker(tmp_path: Path) -> None:
    server = start_workers(tmp_path, "--max-sessions", "2")
    clients: list[UnderstandClient] = []
    try:
        for _ in range(2):
            clients.append(UnderstandClient(server.url, video=None, audio=None))
            await clients[-1].connect()
        for _ in range(ROUNDS):  # wherever the third lands, the limit is the server's, not the worker's
            refused = UnderstandClient(server.url, video=None, audio=None)
            with pytest.raises(SignalingError) as raised:
                await refused.connect()
            await refused.close()
            assert raised.value.status == 503
        first = clients.pop(0)
        assert await call("DELETE", f"{server.url}/v1/rtc/sessions/{first.session_id}", first.session_token) == 200
        await first.close()
        clients.append(UnderstandClient(server.url, video=None, audio=None))
        await clients[-1].connect()  # the closed session's place is free again
    finally:
        await asyncio.gather(*(client.close() for client in clients))
        server.process.kill()
        server.process.wait()


@pytest.mark.media
async def test_an_ephemeral_key_refused_at_max_sessions_is_not_used_up(tmp_path: Path) -> None:
    server = start_workers(tmp_path, "--max-sessions", "1")
    holder = UnderstandClient(server.url, video=None, audio=None)
    try:
        await holder.connect()
        keys = await keys_from_both_workers(server.url)
        for key in keys:
            refused = await open_realtime(server.url, key)
            assert refused == "error: session limit of 1 reached (across all workers)"
        held = f"{server.url}/v1/rtc/sessions/{holder.session_id}"
        assert await call("DELETE", held, holder.session_token) == 200
        for number, key in enumerate(keys):  # the place is free: each key opens its session, once
            assert await open_when_free(server.url, key) == f"session.created: Key {number}."
            assert await open_realtime(server.url, key) == 401
    finally:
        await holder.close()
        server.process.kill()
        server.process.wait()


async def open_when_free(url: str, key: str) -> str | int:
    """open_realtime, again while the one place is still held by the last session, which closes."""
    for _ in range(50):
        answer = await open_realtime(url, key)
        if answer != "error: session limit of 1 reached (across all workers)":
            return answer
        await asyncio.sleep(0.1)
    raise AssertionError("the place was not freed within 5 s")


async def healthz_sessions(url: str) -> int:
    """GET /healthz on a new connection (either worker may answer): its `sessions`."""
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(force_close=True)) as http:
        async with http.get(f"{url}/healthz") as response:
            assert response.status == 200
            return int((await response.json())["sessions"])


@pytest.mark.media
async def test_healthz_counts_the_sessions_of_every_worker(served: Served) -> None:
    clients = [client async for client in open_sessions_on_both_workers(served.url)]
    try:
        assert [await healthz_sessions(served.url) for _ in range(ROUNDS)] == [len(clients)] * ROUNDS
    finally:
        await asyncio.gather(*(client.close() for client in clients))


async def minted_by(url: str, worker: str, deadline: float) -> str:
    """Mint keys, each on a new connection, until `worker` (`w1`) mints one, before `deadline`."""
    while time.monotonic() < deadline:
        key = await mint_key(url, "Are you back?")
        if key.startswith(f"ek_{worker}."):
            return key
        await asyncio.sleep(0.05)
    raise AssertionError(f"{worker} minted no key in time")


async def session_on(url: str, worker: str, make: Callable[[], ControlClient]) -> ControlClient:
    """A new session made by `make` and owned by `worker`; the others opened on the way are closed."""
    for _ in range(MAX_CLIENTS):
        client = make()
        await client.connect()
        if owner(client.session_id or "") == worker:
            return client
        await client.close()
    raise AssertionError(f"{MAX_CLIENTS} sessions, none on {worker}")


def realtime_call(url: str, token: str | None = None) -> RealtimeClient:
    """A realtime call with the events channel only: a text turn needs no media."""
    return RealtimeClient(url, video=None, audio=None, receive_audio=False, token=token)


@pytest.mark.media
async def test_a_killed_worker_ends_only_its_own_sessions_and_is_back_within_5_s(served: Served) -> None:
    clients = [await session_on(served.url, "w0", lambda: realtime_call(served.url))]
    clients.append(await session_on(served.url, "w1", lambda: realtime_call(served.url)))
    survivor, victim = clients
    try:
        question = {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Hello?"}]}
        survivor.send({"type": "conversation.item.create", "item": question})
        mark = len(survivor.events)
        survivor.send({"type": "response.create", "response": {"output_modalities": ["text"]}})
        await survivor.wait_event("response.created", after=mark)
        pid = served.worker_pid(1)
        os.kill(pid, signal.SIGKILL)  # mid-turn on worker 0
        killed_at = time.monotonic()
        done = await survivor.wait_event("response.done", after=mark, timeout=20)
        assert done["response"]["status"] == "completed"
        await minted_by(served.url, "w1", killed_at + 5)  # worker 1 answers again within 5 s
        newcomer = await session_on(served.url, "w1", lambda: realtime_call(served.url))  # with new sessions
        clients.append(newcomer)
        sessions = f"{served.url}/v1/rtc/sessions"
        # reached from either worker: worker 0 forwards to the new worker 1
        newcomer_url = f"{sessions}/{newcomer.session_id}"
        assert [await call("GET", newcomer_url, newcomer.view_token) for _ in range(ROUNDS)] == [200] * ROUNDS
        assert await call("GET", f"{sessions}/{survivor.session_id}", survivor.view_token) == 200
        assert await call("GET", f"{sessions}/{victim.session_id}", victim.view_token) == 404
        assert served.process.poll() is None
        log = served.log.read_text()
        assert f"worker 1 (pid {pid}) was killed by SIGKILL; its sessions (1) are lost; restarting it" in log
        assert re.search(r"worker 1 \(pid \d+\) is back, \d+\.\d\d s after it died", log)
    finally:
        await asyncio.gather(*(client.close() for client in clients))


@pytest.mark.media
async def test_a_drain_lets_every_workers_calls_finish_then_the_server_exits_0(tmp_path: Path) -> None:
    served = start_workers(tmp_path, "--auth-token", "s3cret")
    make = functools.partial(realtime_call, served.url, "s3cret")
    calls = [await session_on(served.url, worker, make) for worker in ("w0", "w1")]
    try:
        # The worker that takes it passes it to the parent, which drains them all.
        assert await call("POST", f"{served.url}/v1/admin/drain", "s3cret") == 202
        deadline = time.monotonic() + 5
        while await healthz_status(served.url) != 503:  # on either worker
            assert time.monotonic() < deadline, "still healthy 5 s after the drain began"
            await asyncio.sleep(0.05)
        for _ in range(ROUNDS):  # wherever it lands, a new session is refused
            refused = realtime_call(served.url, "s3cret")
            with pytest.raises(SignalingError) as raised:
                await refused.connect()
            await refused.close()
            assert raised.value.status == 503
        for live in calls:  # the calls go on, and end when their callers hang up
            question = {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Still on?"}]}
            live.send({"type": "conversation.item.create", "item": question})
            mark = len(live.events)
            live.send({"type": "response.create", "response": {"output_modalities": ["text"]}})
            assert (await live.wait_event("response.done", after=mark, timeout=20))["response"]["status"] == "completed"
            assert served.process.poll() is None
            hang_up = f"{served.url}/v1/realtime/calls/{live.session_id}/hangup"
            assert await call("POST", hang_up, live.session_token) == 200
        assert served.process.wait(timeout=20) == 0
    finally:
        await asyncio.gather(*(live.close() for live in calls))
        if served.process.poll() is None:
            served.process.kill()
            served.process.wait()
    log = served.log.read_text()
    assert "SIGUSR2: draining 2 workers" in log and "every worker drained; exiting" in log
    assert "restarting" not in log


async def healthz_status(url: str) -> int:
    """GET /healthz on a new connection: its status code."""
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(force_close=True)) as http:
        async with http.get(f"{url}/healthz") as response:
            return response.status


@pytest.mark.media
async def test_the_places_of_a_killed_workers_sessions_are_freed(tmp_path: Path) -> None:
    server = start_workers(tmp_path, "--max-sessions", "2")
    clients = [UnderstandClient(server.url, video=None, audio=None) for _ in range(2)]
    try:
        for client in clients:
            await client.connect()
        victim = owner(clients[0].session_id or "")
        os.kill(server.worker_pid(int(victim[1:])), signal.SIGKILL)
        survivors = sum(owner(client.session_id or "") != victim for client in clients)
        deadline = time.monotonic() + 5
        while await healthz_sessions(server.url) != survivors:
            assert time.monotonic() < deadline, "the dead worker's sessions are still counted"
            await asyncio.sleep(0.05)
        for _ in range(2 - survivors):  # the server is full again, not more
            clients.append(UnderstandClient(server.url, video=None, audio=None))
            await clients[-1].connect()
        refused = UnderstandClient(server.url, video=None, audio=None)
        with pytest.raises(SignalingError) as raised:
            await refused.connect()
        await refused.close()
        assert raised.value.status == 503
    finally:
        await asyncio.gather(*(client.close() for client in clients))
        server.process.kill()
        server.process.wait()


@pytest.mark.media
def test_a_worker_that_keeps_dying_soon_after_its_start_is_given_up_with_a_log_line(served: Served) -> None:
    survivor = served.worker_pid(0)
    killed = None
    for _ in range(3):  # the first two are restarted (the second after 1 s), the third is not
        killed = served.worker_pid(1, not_pid=killed)
        os.kill(killed, signal.SIGKILL)
    assert served.process.wait(timeout=30) != 0
    log = served.log.read_text()
    assert f"worker 1 (pid {killed}) was killed by SIGKILL, 3 times in a row within 10 s of its start" in log
    assert "giving up on it; stopping the other workers" in log
    assert not Path(f"/proc/{survivor}").exists()  # stopped (and reaped) by the parent


def test_workers_split_the_ice_port_range() -> None:
    settings = load_settings(
        environ={"RTC_OMNI_WORKERS": "3", "RTC_OMNI_ICE_PORT_MIN": "50000", "RTC_OMNI_ICE_PORT_MAX": "50010"}
    )
    shares = [worker_settings(settings, index, 3, 8080).ice_ports for index in range(3)]
    assert shares == [range(50000, 50003), range(50003, 50006), range(50006, 50011)]


@pytest.mark.parametrize(
    ("environ", "message"),
    [
        (
            {"RTC_OMNI_WORKERS": "4", "RTC_OMNI_ICE_PORT_MIN": "50000", "RTC_OMNI_ICE_PORT_MAX": "50002"},
            "3 ports, fewer than the 4 workers",
        ),
        ({"RTC_OMNI_WORKERS": "0"}, "--workers (RTC_OMNI_WORKERS): must be 'auto' or a number"),
        ({"RTC_OMNI_WORKERS": "many"}, "must be 'auto' or a number of worker processes"),
    ],
)
def test_unusable_worker_settings_are_refused_with_the_reason(environ: dict[str, str], message: str) -> None:
    with pytest.raises(SettingsError, match=re.escape(message)):
        load_settings(environ=environ)


def test_auto_means_one_worker_per_core() -> None:
    assert load_settings(environ={"RTC_OMNI_WORKERS": "auto"}).worker_count == len(os.sched_getaffinity(0))


def test_vllm_with_several_workers_gives_the_workers_the_engine_process_as_their_upstream() -> None:
    settings = load_settings(environ={"RTC_OMNI_ENGINE": "vllm", "RTC_OMNI_WORKERS": "2", "RTC_OMNI_MODEL": "m"})
    worker = remote_settings(settings, "ws://127.0.0.1:4321", "run-token")
    assert (worker.engine, worker.upstream, worker.model) == ("remote", ["ws://127.0.0.1:4321"], "m")
    assert worker.upstream_api_key == "run-token"
    fleet = {"node_id": "n0", "peer": ["n1=http://127.0.0.1:9"], "cluster_key": "k" * 32}
    engine = engine_settings(settings.model_copy(update={"auth_token": "clients-token", **fleet}), 2, "run-token")
    # Every session reaches the engine from 127.0.0.1: no per-client limit may count them as one client.
    assert (engine.engine, engine.model, engine.worker_count) == ("vllm", "m", 1)
    assert (engine.host, engine.port) == ("127.0.0.1", 0)
    # Any local process can reach its port: it takes the workers' token only, not the clients'.
    assert engine.session_rate_limit == 0 and engine.auth_token == "run-token"
    assert engine.max_connections_per_client > engine.max_sessions >= settings.max_sessions
    assert (engine.node_id, engine.peer, engine.cluster_key) == (None, [], None)  # no gateway of the fleet


def synthetic_engine_process() -> EngineProcess:
    """The engine process, serving the synthetic engine: its start, readiness and watch are the subject."""
    return EngineProcess(load_settings(environ={}), workers=2)


@pytest.mark.media
def test_the_engine_process_serves_on_loopback_once_ready_and_its_death_is_noticed() -> None:
    engine = synthetic_engine_process()
    try:
        url = engine.wait_ready(60, lambda: False)
        assert url is not None and re.fullmatch(r"ws://127\.0\.0\.1:\d+", url)
        direct = urllib.request.build_opener(urllib.request.ProxyHandler({}))
        with direct.open(url.replace("ws://", "http://") + "/health", timeout=10) as health:
            assert json.load(health)["status"] == "ok"
        sessions = url.replace("ws://", "http://") + "/v1/video/chat/stream"
        with pytest.raises(urllib.error.HTTPError, match="401"):  # a process that lacks this run's token
            direct.open(sessions, timeout=10)
        authorised = urllib.request.Request(sessions, headers={"Authorization": f"Bearer {engine.token}"})
        with pytest.raises(urllib.error.HTTPError, match="400"):  # past the token: not a WebSocket upgrade
            direct.open(authorised, timeout=10)
        assert engine.failure() is None
        os.kill(engine.pid, signal.SIGKILL)
        engine.process.wait(timeout=10)
        assert engine.failure() == f"vLLM engine process (pid {engine.pid}) was killed by SIGKILL"
    finally:
        engine.stop()


@pytest.mark.media
def test_an_engine_process_not_ready_in_time_is_a_clear_error_and_is_stopped() -> None:
    engine = synthetic_engine_process()
    try:
        # Its imports alone take longer than this.
        with pytest.raises(EngineStartError, match=r"not ready within --engine-start-timeout \(0\.05 s\)"):
            engine.wait_ready(0.05, lambda: False)
    finally:
        engine.stop()
    assert engine.process.returncode is not None


def test_an_engine_process_that_exits_before_it_is_ready_is_a_clear_error() -> None:
    if importlib.util.find_spec("vllm_omni") is not None:
        pytest.skip("vLLM-Omni is installed here: the engine would load")
    engine = EngineProcess(load_settings(environ={"RTC_OMNI_ENGINE": "vllm", "RTC_OMNI_WORKERS": "2"}), workers=2)
    try:
        with pytest.raises(EngineStartError, match=r"exited with status 2 before it was ready"):
            engine.wait_ready(60, lambda: False)
    finally:
        engine.stop()


def test_a_stop_request_while_the_engine_loads_stops_waiting() -> None:
    engine = synthetic_engine_process()
    try:
        assert engine.wait_ready(60, lambda: True) is None
    finally:
        engine.stop()
