"""`GET /metrics` with `--workers N`: the whole server's figures, whichever worker takes the scrape.

Each worker counts in its own registry (metrics.py) and the kernel hands a scrape to any of them,
so the worker that takes it asks every sibling for its own figures over the sibling's Unix socket
(forwarding.py) and merges the answers with its own.

Why not prometheus_client's multiprocess mode: the session gauges, the asyncio task count and the
process figures are read at scrape time from live objects of the process that holds them, and that
mode cannot carry such figures (it sums what each process writes to files as things happen; custom
collectors and ProcessCollector are left out). It would also need PROMETHEUS_MULTIPROC_DIR set
before the library is first imported, and the folder cleaned at start and after a worker dies.
Asking the workers keeps every figure exactly what one process reports, for one local request per
sibling per scrape.

- The scraper's credentials (its Authorization header and query string) go along, so each sibling
  checks the server token as the worker that took the scrape did: no way around it. A scrape that
  came over a sibling's socket is answered with that worker's own figures only.
- The siblings are asked at once, each given SCRAPE_TIMEOUT_S. One that does not answer in time, or
  answers anything but 200 and Prometheus text, is left out of the sums and counted in
  `rtc_omni_workers_missing`: the scrape still answers 200.
- Counters, histograms and gauges (the sessions) are summed per label set; `*_created` (when a
  counter started) takes the earliest. The figures of one process (`process_*`,
  `rtc_omni_asyncio_tasks`) get a `worker` label instead: a sum of start times or fd limits means
  nothing, and a dashboard wants to see which worker leaks or burns CPU.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterator, Mapping, Sequence

import aiohttp
from aiohttp import web
from prometheus_client import generate_latest
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.registry import Collector
from prometheus_client.samples import Sample

from ..metrics import REGISTRY, prometheus_text
from .identity import Worker

logger = logging.getLogger(__name__)

METRICS_PATH = "/metrics"
SCRAPE_TIMEOUT_S = 2.0  # per sibling, all asked at once; Prometheus's own scrape timeout is 10 s
PER_PROCESS = ("process_", "rtc_omni_asyncio_tasks")  # family names (prefixes) labelled by worker
WORKER_LABEL = "worker"
MISSING = "rtc_omni_workers_missing"


def merge(shares: Mapping[int, Sequence[Metric]]) -> list[Metric]:
    """The whole server's metric families, from each worker's (keyed by worker index)."""
    merged: dict[str, Metric] = {}
    samples: dict[str, dict[tuple[str, tuple[tuple[str, str], ...]], Sample]] = {}
    for index, families in sorted(shares.items()):
        for family in families:
            if family.name not in merged:
                merged[family.name] = Metric(family.name, family.documentation, family.type, family.unit)
                samples[family.name] = {}
            kept = samples[family.name]
            per_process = family.name.startswith(PER_PROCESS)
            for sample in family.samples:
                labels = {**sample.labels, WORKER_LABEL: str(index)} if per_process else sample.labels
                key = (sample.name, tuple(sorted(labels.items())))
                value = sample.value
                if key in kept:
                    earlier = kept[key].value
                    value = min(earlier, value) if sample.name.endswith("_created") else earlier + value
                kept[key] = Sample(sample.name, labels, value)
    for name, family in merged.items():
        family.samples = list(samples[name].values())
    return list(merged.values())


class _Families(Collector):
    """Families already collected, for generate_latest."""

    def __init__(self, families: list[Metric]) -> None:
        self.families = families

    def collect(self) -> Iterator[Metric]:
        return iter(self.families)


def exposition(families: list[Metric]) -> bytes:
    return generate_latest(_Families(families))


class WholeServerScrape:
    """Answers a scrape that reached this worker from outside with every worker's figures merged."""

    def __init__(self, worker: Worker, sibling: Callable[[int], aiohttp.ClientSession]) -> None:
        self.worker = worker
        self.sibling = sibling  # a client session bound to that worker's Unix socket

    async def __call__(self, request: web.Request) -> web.Response:
        siblings = [index for index in range(self.worker.count) if index != self.worker.index]
        answers = await asyncio.gather(*(self._share_of(index, request) for index in siblings))
        shares = {self.worker.index: list(text_string_to_metric_families(generate_latest(REGISTRY).decode()))}
        shares.update((index, answer) for index, answer in zip(siblings, answers, strict=True) if answer is not None)
        families = merge(shares)
        families.append(
            GaugeMetricFamily(
                MISSING,
                f"Workers that did not answer this scrape within {SCRAPE_TIMEOUT_S:g} s: their figures are not in it.",
                value=self.worker.count - len(shares),
            )
        )
        return prometheus_text(exposition(families))

    async def _share_of(self, index: int, request: web.Request) -> list[Metric] | None:
        """Worker `index`'s own families, asked with the scraper's credentials; None if it fails."""
        credentials = {"Authorization": request.headers["Authorization"]} if "Authorization" in request.headers else {}
        try:
            async with self.sibling(index).get(
                f"http://worker-{index}{request.path_qs}",
                headers=credentials,
                timeout=aiohttp.ClientTimeout(total=SCRAPE_TIMEOUT_S),
            ) as answer:
                if answer.status != 200:
                    raise ValueError(f"it answered {answer.status}")
                return list(text_string_to_metric_families(await answer.text()))
        except (aiohttp.ClientError, TimeoutError, ValueError) as exc:
            logger.warning(
                "worker %d: worker %d's metrics are missing from this scrape (%s)",
                self.worker.index,
                index,
                str(exc) or exc.__class__.__name__,
            )
            return None
