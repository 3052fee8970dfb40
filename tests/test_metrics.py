"""`GET /metrics`: Prometheus text a scraper understands, moving with what sessions do."""

from __future__ import annotations

import asyncio

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

from .conftest import ClientFactory, RunningServer, ServerFactory


async def scrape(server: RunningServer) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    async with aiohttp.ClientSession() as http:
        async with http.get(server.url + "/metrics") as response:
            assert response.status == 200 and response.content_type == "text/plain"
            text = await response.text()
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


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
