"""`GET /metrics`: Prometheus text a scraper understands, moving with what sessions do."""

from __future__ import annotations

import asyncio
import tempfile
from pathlib import Path

import aiohttp
import pytest
from aiohttp.test_utils import TestServer
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from rtc_omni.app import create_app
from rtc_omni.config import Settings
from rtc_omni.engines import create_engines
from rtc_omni.metrics import REGISTRY
from rtc_omni.workers import SessionSlots, Worker
from rtc_omni.workers import scrape as whole_server
from rtc_omni.workers.scrape import exposition, merge

from .conftest import FAST_SETTINGS, ClientFactory, RunningServer, ServerFactory
from .prometheus_text import Samples, parsed


async def scrape(server: RunningServer) -> Samples:
    async with aiohttp.ClientSession() as http:
        async with http.get(server.url + "/metrics") as response:
            assert response.status == 200 and response.content_type == "text/plain"
            return parsed(await response.text())


def value(samples: dict, name: str, **labels: str) -> float:
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)


async def test_metrics_follow_sessions_turns_frames_and_errors(
    server: RunningServer, make_client: ClientFactory
) -> None:
    before = await scrape(server)
    client = await make_client(server, colour="red", tone=440.0, config={"modalities": ["text"]})
    await client.wait_event("video.frame.ack")
    await client.ask("hello")
    client.send("{broken")
    await client.wait_event("error")
    after = await scrape(server)

    assert value(after, "rtc_omni_sessions", kind="understand", state="active") >= 1
    for stage in ("received", "sampled"):
        assert value(after, "rtc_omni_frames_total", stage=stage) > value(before, "rtc_omni_frames_total", stage=stage)
    assert value(after, "rtc_omni_turns_total", outcome="completed") == (
        value(before, "rtc_omni_turns_total", outcome="completed") + 1
    )
    assert value(after, "rtc_omni_time_to_first_text_seconds_count") == (
        value(before, "rtc_omni_time_to_first_text_seconds_count") + 1
    )
    assert value(after, "rtc_omni_audio_in_milliseconds_total") > value(before, "rtc_omni_audio_in_milliseconds_total")
    assert value(after, "rtc_omni_errors_total", kind="understand", type="Invalid JSON") == (
        value(before, "rtc_omni_errors_total", kind="understand", type="Invalid JSON") + 1
    )


async def test_metrics_need_the_token_when_one_is_set(make_server: ServerFactory) -> None:
    server = await make_server(auth_token="s3cret")
    async with aiohttp.ClientSession() as http:
        async with http.get(server.url + "/metrics") as response:
            assert response.status == 401
        async with http.get(server.url + "/metrics", headers={"Authorization": "Bearer s3cret"}) as response:
            assert response.status == 200 and "rtc_omni_sessions" in await response.text()


async def test_task_memory_and_fd_gauges_return_after_a_session_ends(
    server: RunningServer, make_client: ClientFactory
) -> None:
    before = await scrape(server)
    client = await make_client(server, colour="red", tone=440.0, config={"modalities": ["text"]})
    await client.wait_event("video.frame.ack")
    await client.ask("hello")
    during = await scrape(server)
    await client.close()
    for _ in range(50):  # the server notices the closed peer within a few hundred ms
        after = await scrape(server)
        if value(after, "rtc_omni_asyncio_tasks") <= value(before, "rtc_omni_asyncio_tasks"):
            break
        await asyncio.sleep(0.1)

    assert value(during, "rtc_omni_asyncio_tasks") > value(before, "rtc_omni_asyncio_tasks")
    assert value(after, "rtc_omni_asyncio_tasks") <= value(before, "rtc_omni_asyncio_tasks")
    assert value(after, "process_resident_memory_bytes") > 0
    assert value(after, "process_open_fds") > 0


# --workers N: the worker that takes a scrape merges every worker's figures (rtc_omni/workers/scrape.py).

WORKER_0 = """\
# HELP rtc_omni_turns_total Turns.
# TYPE rtc_omni_turns_total counter
rtc_omni_turns_total{outcome="completed"} 2.0
# HELP rtc_omni_turns_created Turns.
# TYPE rtc_omni_turns_created gauge
rtc_omni_turns_created{outcome="completed"} 200.0
# HELP rtc_omni_ttft_seconds Time to first text.
# TYPE rtc_omni_ttft_seconds histogram
rtc_omni_ttft_seconds_bucket{le="0.5"} 1.0
rtc_omni_ttft_seconds_bucket{le="+Inf"} 2.0
rtc_omni_ttft_seconds_count 2.0
rtc_omni_ttft_seconds_sum 1.5
# HELP rtc_omni_sessions Sessions.
# TYPE rtc_omni_sessions gauge
rtc_omni_sessions{kind="understand",state="active"} 1.0
# HELP process_resident_memory_bytes Memory.
# TYPE process_resident_memory_bytes gauge
process_resident_memory_bytes 1000.0
"""
WORKER_1 = """\
# HELP rtc_omni_turns_total Turns.
# TYPE rtc_omni_turns_total counter
rtc_omni_turns_total{outcome="completed"} 3.0
rtc_omni_turns_total{outcome="failed"} 1.0
# HELP rtc_omni_turns_created Turns.
# TYPE rtc_omni_turns_created gauge
rtc_omni_turns_created{outcome="completed"} 100.0
rtc_omni_turns_created{outcome="failed"} 300.0
# HELP rtc_omni_ttft_seconds Time to first text.
# TYPE rtc_omni_ttft_seconds histogram
rtc_omni_ttft_seconds_bucket{le="0.5"} 0.0
rtc_omni_ttft_seconds_bucket{le="+Inf"} 1.0
rtc_omni_ttft_seconds_count 1.0
rtc_omni_ttft_seconds_sum 0.75
# HELP rtc_omni_sessions Sessions.
# TYPE rtc_omni_sessions gauge
rtc_omni_sessions{kind="understand",state="active"} 2.0
rtc_omni_sessions{kind="generate",state="active"} 1.0
# HELP process_resident_memory_bytes Memory.
# TYPE process_resident_memory_bytes gauge
process_resident_memory_bytes 2000.0
"""


def test_workers_figures_merge_into_the_servers() -> None:
    shares = {index: list(text_string_to_metric_families(text)) for index, text in enumerate((WORKER_0, WORKER_1))}
    merged = parsed(exposition(merge(shares)))

    assert merged == {
        ("rtc_omni_turns_total", (("outcome", "completed"),)): 5.0,
        ("rtc_omni_turns_total", (("outcome", "failed"),)): 1.0,
        ("rtc_omni_turns_created", (("outcome", "completed"),)): 100.0,  # the earliest start
        ("rtc_omni_turns_created", (("outcome", "failed"),)): 300.0,
        ("rtc_omni_ttft_seconds_bucket", (("le", "0.5"),)): 1.0,
        ("rtc_omni_ttft_seconds_bucket", (("le", "+Inf"),)): 3.0,
        ("rtc_omni_ttft_seconds_count", ()): 3.0,
        ("rtc_omni_ttft_seconds_sum", ()): 2.25,
        ("rtc_omni_sessions", (("kind", "understand"), ("state", "active"))): 3.0,
        ("rtc_omni_sessions", (("kind", "generate"), ("state", "active"))): 1.0,
        ("process_resident_memory_bytes", (("worker", "0"),)): 1000.0,  # one process's figure: kept apart
        ("process_resident_memory_bytes", (("worker", "1"),)): 2000.0,
    }


def test_one_workers_figures_come_back_as_it_wrote_them() -> None:
    """Types, help texts, `_created` lines and values survive the parser and the merge unchanged."""
    text = generate_latest(REGISTRY).decode()
    merged = exposition(merge({0: list(text_string_to_metric_families(text))})).decode()
    assert merged.replace('{worker="0"}', "") == text


async def test_a_worker_that_does_not_answer_is_reported_and_left_out(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Worker 0 of two, whose sibling's socket accepts a scrape and never answers (a stuck worker)."""
    monkeypatch.setattr(whole_server, "SCRAPE_TIMEOUT_S", 0.2)
    socket_dir = Path(tempfile.mkdtemp(dir=tmp_path))
    stuck = await asyncio.start_unix_server(lambda reader, writer: None, path=str(socket_dir / "worker-1.sock"))
    settings = Settings(**{**FAST_SETTINGS, "auth_token": "s3cret"})
    worker = Worker(0, 2, socket_dir, b"k" * 32, SessionSlots(2))
    server = TestServer(create_app(settings, await create_engines(settings), worker), host="127.0.0.1", port=0)
    await server.start_server()
    try:
        async with aiohttp.ClientSession() as http:
            async with http.get(f"{server.make_url('/metrics')}") as response:
                assert response.status == 401  # refused before any sibling is asked
            async with http.get(f"{server.make_url('/metrics')}?access_token=s3cret") as response:
                assert response.status == 200
                samples = parsed(await response.text())
    finally:
        await server.close()
        stuck.close()
    assert samples[("rtc_omni_workers_missing", ())] == 1
    assert samples[("process_resident_memory_bytes", (("worker", "0"),))] > 0
    assert ("process_resident_memory_bytes", (("worker", "1"),)) not in samples


async def test_a_realtime_response_counts_in_the_same_turn_metrics(server: RunningServer) -> None:
    before = await scrape(server)
    async with aiohttp.ClientSession() as http, http.ws_connect(server.url + "/v1/realtime?model=m") as ws:
        item = {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Hello?"}]}
        await ws.send_json({"type": "conversation.item.create", "item": item})
        await ws.send_json({"type": "response.create", "response": {"output_modalities": ["text"]}})
        async with asyncio.timeout(20):
            while (event := await ws.receive_json())["type"] != "response.done":
                pass
    after = await scrape(server)

    assert event["response"]["status"] == "completed"
    for outcome in ("started", "completed"):
        assert value(after, "rtc_omni_turns_total", outcome=outcome) == (
            value(before, "rtc_omni_turns_total", outcome=outcome) + 1
        )
    assert value(after, "rtc_omni_time_to_first_text_seconds_count") == (
        value(before, "rtc_omni_time_to_first_text_seconds_count") + 1
    )
