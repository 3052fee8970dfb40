"""Prometheus metrics, served at `GET /metrics` (behind the token when one is set).

Counters and histograms are process-wide, in one registry, and are updated where things happen;
the session gauges are read from the live session registries at scrape time, and so are the
process's resident memory, open file descriptors and asyncio task count, so a leak of any of
them shows on a dashboard (benchmarks/soak.py watches exactly these).
"""

from __future__ import annotations

import asyncio
import weakref
from collections import Counter as Tally
from collections.abc import Iterator
from typing import Any

from aiohttp import web
from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Histogram,
    ProcessCollector,
    generate_latest,
)
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

REGISTRY = CollectorRegistry(auto_describe=True)

FRAMES = Counter(
    "rtc_omni_frames",
    "Camera frames: received (decoded), sampled (reached EVS), filtered (dropped by EVS).",
    ["stage"],
    registry=REGISTRY,
)
AUDIO_MS_IN = Counter(
    "rtc_omni_audio_in_milliseconds", "Microphone audio taken in, in milliseconds.", registry=REGISTRY
)
TURNS = Counter(
    "rtc_omni_turns",
    "Understanding turns by outcome (started, completed, cancelled, failed).",
    ["outcome"],
    registry=REGISTRY,
)
_LATENCY_BUCKETS = (0.05, 0.1, 0.2, 0.3, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0, 5.0, 10.0)
TIME_TO_FIRST_TEXT = Histogram(
    "rtc_omni_time_to_first_text_seconds",
    "From the turn's start to its first text from the engine.",
    buckets=_LATENCY_BUCKETS,
    registry=REGISTRY,
)
TIME_TO_FIRST_AUDIO = Histogram(
    "rtc_omni_time_to_first_audio_seconds",
    "From the turn's start to its first speech from the engine.",
    buckets=_LATENCY_BUCKETS,
    registry=REGISTRY,
)
GENERATED_FRAMES_SENT = Counter(
    "rtc_omni_generated_frames_sent", "Generated video frames handed to the RTP sender.", registry=REGISTRY
)
DATACHANNEL_OVERFLOWS = Counter(
    "rtc_omni_datachannel_overflows",
    "Peers closed because their control DataChannel took no events (over 1 MiB unsent).",
    registry=REGISTRY,
)
OUTGOING_FRAMES_DROPPED = Counter(
    "rtc_omni_outgoing_frames_dropped",
    "Outgoing frames dropped for a consumer (an RTP sender, a shared encoder) that stopped reading.",
    ["kind"],
    registry=REGISTRY,
)
ERRORS = Counter(
    "rtc_omni_errors",
    "Error events sent to clients, by session kind and error type.",
    ["kind", "type"],
    registry=REGISTRY,
)


def error_type(message: str) -> str:
    """A bounded label for an error message: the part before any details."""
    return message.split(":", 1)[0].strip()[:60] or "unknown"


class _SessionGauges(Collector):
    """Live sessions by kind and state, summed over every session registry in the process."""

    def __init__(self) -> None:
        self.sources: weakref.WeakSet[Any] = weakref.WeakSet()

    def collect(self) -> Iterator[GaugeMetricFamily]:
        family = GaugeMetricFamily("rtc_omni_sessions", "Live sessions by kind and state.", labels=["kind", "state"])
        tally: Tally[tuple[str, str]] = Tally()
        for registry in list(self.sources):
            for session_id in registry:
                live = registry.get(session_id)
                inner = getattr(live, "session", None)
                if inner is not None:
                    tally[(live.kind, inner.state)] += 1
        for (kind, state), count in sorted(tally.items()):
            family.add_metric([kind, state], count)
        yield family


SESSION_GAUGES = _SessionGauges()
REGISTRY.register(SESSION_GAUGES)


class _TaskGauge(Collector):
    """asyncio tasks alive in the serving loop: every session's tasks must end when it closes."""

    def collect(self) -> Iterator[GaugeMetricFamily]:
        try:
            tasks = len(asyncio.all_tasks())
        except RuntimeError:  # scraped outside a running loop (a test collecting directly)
            tasks = 0
        yield GaugeMetricFamily("rtc_omni_asyncio_tasks", "asyncio tasks alive in the server's event loop.", tasks)


REGISTRY.register(_TaskGauge())
# process_resident_memory_bytes, process_open_fds, process_cpu_seconds_total (Linux /proc)
ProcessCollector(registry=REGISTRY)


def watch_sessions(registry: Any) -> None:
    """Count this registry's sessions in `rtc_omni_sessions`."""
    SESSION_GAUGES.sources.add(registry)


def prometheus_text(body: bytes) -> web.Response:
    """`body` (Prometheus text exposition) as the answer to a scrape."""
    response = web.Response(body=body)
    response.content_type = CONTENT_TYPE_LATEST.split(";")[0]
    response.charset = "utf-8"
    return response


async def get_metrics(request: web.Request) -> web.Response:
    """This process's figures (with --workers, a sibling's share of a scrape: workers/scrape.py)."""
    return prometheus_text(generate_latest(REGISTRY))
