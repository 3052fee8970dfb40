"""Why a session costs less the more there are: the same work costs more on a core that idled.

At N=8 the server and its peers keep two cores about a quarter busy, so nearly every datagram,
decoded frame and timer wakes a core that was idle. Here the cores are a virtual machine's, whose
idle driver halts at once (`haltpoll`, `guest_halt_poll_ns=0` on the kernel's command line). Work
that starts on a core that idled runs slower, and that time is the server's own CPU time: its
caches and branch predictors were cooled by whatever ran there meanwhile (this machine has no
hardware counters to tell which). At N=28 the cores are busy, so the same work is cheaper per
session.

Two measurements, each against the same machine with its cores kept from idling by one
lowest-priority spinner per core (`SCHED_IDLE`: it runs only when nothing else wants the core, and
is never counted in the server's CPU):

1. the same small piece of Python (20 RTP packets parsed, 20 small JSON events) back to back, and
   after sleeps of 2.5 and 20 ms: its thread CPU time, median;
2. the capacity sweep's load at N sessions (`rtc_omni.bench.capacity.session_point`: replayed
   cameras and mics, talker on, a turn every 5 s), a fresh `rtc-omni serve` per round, with and
   without the spinners, alternating: the server's CPU-seconds per second per session.

Figures: docs/benchmarks.md, "Why a session costs less the more there are".
Run inside the loopback namespace: python -m benchmarks.cold_cores [N] [SECONDS] [ROUNDS]
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator

from aiortc.rtp import RtpPacket

from rtc_omni import patches
from rtc_omni.bench.capacity import session_point
from rtc_omni.bench.common import start_server, stop

SPIN = """import os, time
os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
end = time.monotonic() + {s}
while time.monotonic() < end:
    pass
"""
# A spinner ends by itself this long after the measurement it serves should have ended, whatever
# happens to this process.
SPIN_SPARE_S = 120.0
GAPS_S = (0.0, 0.0025, 0.020)
WORK_RUNS = 500
WORK_ROUNDS = 3
_PACKET = RtpPacket(payload_type=96, sequence_number=1, timestamp=1, ssrc=1, payload=bytes(1000)).serialize()


@contextlib.contextmanager
def busy_cores(on: bool, seconds: float) -> Iterator[None]:
    """One SCHED_IDLE spinner per core this process may use while inside, if `on`: the cores never
    idle. `seconds`: how long the measurement inside should take."""
    spinners: list[subprocess.Popen[bytes]] = []
    try:
        for _ in range(len(os.sched_getaffinity(0)) if on else 0):
            spinners.append(subprocess.Popen([sys.executable, "-c", SPIN.format(s=seconds + SPIN_SPARE_S)]))
        time.sleep(0.5 if on else 0)
        yield
    finally:
        for spinner in spinners:
            spinner.kill()
            spinner.wait()


def _work() -> None:
    for _ in range(20):
        packet = RtpPacket.parse(_PACKET)
        json.dumps({"type": "event", "seq": packet.sequence_number, "ts": packet.timestamp})


def work_after_gap(gap_s: float) -> float:
    """Median thread CPU time of `_work` in µs, each run after sleeping `gap_s`."""
    times = []
    for _ in range(WORK_RUNS):
        if gap_s:
            time.sleep(gap_s)
        start = time.thread_time_ns()
        _work()
        times.append(time.thread_time_ns() - start)
    return statistics.median(times) / 1000


async def session_cpu(sessions: int, seconds: float) -> float:
    """Per-session server CPU-s/s of one fresh server under the capacity load."""
    process, url = start_server(["--max-sessions", str(sessions + 1)])
    try:
        point = await session_point(url, process.pid, sessions, seconds)
    finally:
        stop(process)
    return point.cpu_per_session


def _cores(busy: bool) -> str:
    return "busy cores" if busy else "idle cores"


def _alternating(rounds: int) -> Iterator[tuple[int, bool]]:
    """(round, busy) for each measurement: idle and busy cores alternate, so the machine's drift
    falls on both."""
    for round_ in range(1, rounds + 1):
        for busy in (False, True) if round_ % 2 else (True, False):
            yield round_, busy


def work_rounds() -> None:
    print("1. the same Python work (20 RTP packets parsed, 20 JSON events), median thread CPU µs:")
    runs: dict[bool, list[list[float]]] = {False: [], True: []}
    for round_, busy in _alternating(WORK_ROUNDS):
        with busy_cores(busy, WORK_RUNS * sum(GAPS_S)):
            runs[busy].append([work_after_gap(gap) for gap in GAPS_S])
        figures = ", ".join(f"{us:6.1f} after {gap * 1000:4.1f} ms" for us, gap in zip(runs[busy][-1], GAPS_S))
        print(f"   round {round_} {_cores(busy)}: {figures}", flush=True)
    for busy, medians in runs.items():
        means = ", ".join(f"{statistics.mean(m[i] for m in medians):6.1f}" for i in range(len(GAPS_S)))
        print(f"   means, {_cores(busy)}: {means}")


async def session_rounds(sessions: int, seconds: float, rounds: int) -> None:
    print(f"2. N={sessions}, {seconds:.0f} s per round, server CPU-s/s per session:")
    results: dict[bool, list[float]] = {False: [], True: []}
    for round_, busy in _alternating(rounds):
        with busy_cores(busy, seconds):
            results[busy].append(await session_cpu(sessions, seconds))
        print(f"   round {round_} {_cores(busy)}: {results[busy][-1]:.4f}", flush=True)
    idle, busy_mean = statistics.mean(results[False]), statistics.mean(results[True])
    print(f"   means: idle cores {idle:.4f}, busy cores {busy_mean:.4f} ({(busy_mean - idle) / idle:+.0%})")


async def main(sessions: int, seconds: float, rounds: int) -> None:
    work_rounds()
    patches.apply()
    await session_rounds(sessions, seconds, rounds)


if __name__ == "__main__":
    n, secs, rounds = (sys.argv[1:] + ["8", "15", "4"][len(sys.argv) - 1 :])[:3]
    asyncio.run(main(int(n), float(secs), int(rounds)))
