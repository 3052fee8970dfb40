"""`rtc-omni serve --workers N`: workers share the port, and every session's routes reach the worker
that owns it, whichever worker the kernel hands the connection to; one --max-sessions across them;
a scrape of /metrics and /healthz on any worker count them all; a dead worker stops the server with a log line
naming it. The engine process of `--engine vllm --workers N` (here serving the synthetic engine;
tests/test_vllm_cpu_workers.py runs the real one)."""

from __future__ import annotations

import asyncio
import importlib.util
import json
import os
import re
import select
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import aiohttp
import pytest

from rtc_omni.client.rtc_peers import SignalingError, UnderstandClient
from rtc_omni.config import SettingsError, load_settings
from rtc_omni.workers.engine_process import EngineProcess, EngineStartError, engine_settings, remote_settings
from rtc_omni.workers.supervisor import worker_settings

from .prometheus_text import Samples, parsed
from .whep_player import WhepPlayer, viewing

BANNER = re.compile(r"on (http://127\.0\.0\.1:\d+) \(2 workers\)")
MAX_CLIENTS = 16  # sessions opened until both workers own one (each lands on either: 2^-15 to miss)
ROUNDS = 8  # calls per session, each on a new connection, so the kernel picks a worker each time


class Served:
    def __init__(self, process: subprocess.Popen[str], url: str, log: Path) -> None:
        self.process, self.url, self.log = process, url, log

    def worker_pids(self) -> list[int]:
        children = Path(f"/proc/{self.process.pid}/task/{self.process.pid}/children").read_text()
        return [int(pid) for pid in children.split()]


def start_workers(tmp_path: Path, *args: str) -> Served:
    """`rtc-omni serve --workers 2 --port 0 ARGS`, once its banner (printed when both listen) is out."""
    log = tmp_path / "server.log"
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "rtc_omni",
            "serve",
            "--workers",
            "2",
            "--port",
            "0",
            "--session-rate-limit",
            "0",
            *args,
        ],
        stdout=subprocess.PIPE,
        stderr=log.open("w"),
        text=True,
    )
    assert process.stdout is not None
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        readable, _, _ = select.select([process.stdout], [], [], 1.0)
        line = process.stdout.readline() if readable else ""
        if match := BANNER.search(line):
            return Served(process, match.group(1), log)
        assert process.poll() is None, log.read_text()
    process.kill()
    raise AssertionError(f"no banner within 30 s: {log.read_text()}")


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


async def call(method: str, url: str, token: str | None) -> int:
    """One request on its own connection (a new one: the kernel may give it to either worker)."""
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(force_close=True)) as http:
        async with http.request(method, url, headers=headers) as response:
            await response.read()
            return response.status


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


async def open_realtime(url: str, key: str) -> str | int:
    """Open WS /v1/realtime with an ephemeral key: its first event's type and instructions (or
    message, for an error), or the refusal's status."""
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(force_close=True)) as http:
        try:
            async with http.ws_connect(
                url.replace("http", "ws") + "/v1/realtime?model=qwen3-omni", headers={"Authorization": f"Bearer {key}"}
            ) as ws:
                first = await ws.receive_json(timeout=10)
                said = first["message"] if first["type"] == "error" else first["session"]["instructions"]
                return f"{first['type']}: {said}"
        except aiohttp.WSServerHandshakeError as exc:
            return exc.status


async def mint_key(url: str, instructions: str) -> str:
    """POST /v1/realtime/client_secrets on a new connection (either worker may mint it)."""
    body = {"session": {"type": "realtime", "instructions": instructions}}
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(force_close=True)) as http:
        async with http.post(f"{url}/v1/realtime/client_secrets", json=body) as response:
            assert response.status == 200
            return str((await response.json())["value"])


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


@pytest.mark.media
def test_a_worker_killed_stops_the_server_with_a_log_line(served: Served) -> None:
    survivor, victim = served.worker_pids()
    os.kill(victim, signal.SIGKILL)
    assert served.process.wait(timeout=30) != 0
    assert re.search(rf"worker \d \(pid {victim}\) was killed by SIGKILL", served.log.read_text())
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
    engine = engine_settings(settings.model_copy(update={"auth_token": "clients-token"}), 2, "run-token")
    # Every session reaches the engine from 127.0.0.1: no per-client limit may count them as one client.
    assert (engine.engine, engine.model, engine.worker_count) == ("vllm", "m", 1)
    assert (engine.host, engine.port) == ("127.0.0.1", 0)
    # Any local process can reach its port: it takes the workers' token only, not the clients'.
    assert engine.session_rate_limit == 0 and engine.auth_token == "run-token"
    assert engine.max_connections_per_client > engine.max_sessions >= settings.max_sessions


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
