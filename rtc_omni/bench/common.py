"""What every measurement shares: the server subprocess, CPU accounting, percentiles, silence."""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from typing import IO, Protocol

from ..client.media import AudioRecorder
from ..client.rtc_peers import ControlClient

CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q / 100 * (len(ordered) - 1))))]


def stats_ms(values: list[float]) -> dict[str, float]:
    """p50/p95/p99 in milliseconds of samples in seconds, and their count."""
    if not values:
        return {"n": 0}
    return {
        "p50": round(percentile(values, 50) * 1000, 1),
        "p95": round(percentile(values, 95) * 1000, 1),
        "p99": round(percentile(values, 99) * 1000, 1),
        "n": len(values),
    }


def summary(values: list[float]) -> str:
    """p50 and p95 in ms, for the scripts' one-line figures."""
    s = stats_ms(values)
    return f"p50 {s['p50']:.1f} ms, p95 {s['p95']:.1f} ms, n={s['n']}" if s["n"] else "no samples"


def process_cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS


def process_tree(pid: int) -> list[int]:
    """`pid` and its descendants alive now: a server and the workers it started."""
    found, index = [pid], 0
    while index < len(found):
        try:
            tasks = os.listdir(f"/proc/{found[index]}/task")
        except FileNotFoundError:
            tasks = []
        for task in tasks:
            try:
                with open(f"/proc/{found[index]}/task/{task}/children") as children:
                    found.extend(int(child) for child in children.read().split())
            except FileNotFoundError:
                pass
        index += 1
    return found


@dataclass
class CpuMeter:
    """CPU-seconds per wall second of some processes since it was made."""

    pids: list[int]

    def __post_init__(self) -> None:
        self._cpu0 = [process_cpu_seconds(pid) for pid in self.pids]
        self._t0 = time.monotonic()

    def cpu_seconds(self) -> list[float]:
        return [process_cpu_seconds(pid) - c for pid, c in zip(self.pids, self._cpu0)]

    def per_second(self) -> list[float]:
        elapsed = time.monotonic() - self._t0
        return [cpu / elapsed for cpu in self.cpu_seconds()]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def wait_healthy(url: str, process: subprocess.Popen[bytes], timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"{process.args!r} exited with {process.returncode}")
        try:
            urllib.request.urlopen(url, timeout=1).read()
            return
        except OSError:
            time.sleep(0.05)
    process.kill()
    raise RuntimeError(f"{url} did not answer within {timeout} s")


def start_server(
    extra_args: list[str] | None = None, env: dict[str, str] | None = None, log: IO[bytes] | None = None
) -> tuple[subprocess.Popen[bytes], str]:
    """`rtc-omni serve` (synthetic engines, tone voice) on a free loopback port, ready for offers;
    `env` added to this process's, its output to `log` (else discarded)."""
    port = free_port()
    args = ["serve", "--host", "127.0.0.1", "--port", str(port), "--synthetic-voice", "tone"]
    process = subprocess.Popen(
        [sys.executable, "-m", "rtc_omni", *args, "--log-level", "warning", *(extra_args or [])],
        stdout=log or subprocess.DEVNULL,
        stderr=subprocess.STDOUT if log else subprocess.DEVNULL,
        env=None if env is None else {**os.environ, **env},
    )
    url = f"http://127.0.0.1:{port}"
    wait_healthy(url + "/healthz", process)
    return process, url


def stop(process: subprocess.Popen[bytes]) -> None:
    process.terminate()
    try:
        process.wait(timeout=15)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


@contextlib.contextmanager
def server(
    extra_args: list[str] | None = None, env: dict[str, str] | None = None, log: IO[bytes] | None = None
) -> Iterator[tuple[subprocess.Popen[bytes], str]]:
    process, url = start_server(extra_args, env, log)
    try:
        yield process, url
    finally:
        stop(process)


def silent_from(recorder: AudioRecorder, since: float, run: int = 3) -> float | None:
    """Arrival time of the first of `run` consecutive silent frames after `since`."""
    frames = [f for f in recorder.frames if f.at >= since]
    for i in range(len(frames) - run + 1):
        if all(f.rms < recorder.SILENCE_RMS for f in frames[i : i + run]):
            return frames[i].at
    return None


class SentFrames(Protocol):
    """A camera track that remembers when it handed out each frame, by pts (90 kHz ticks)."""

    sent_at: dict[int, float]


def ack_latencies(client: ControlClient, video: SentFrames, skip: int = 5, after: int = 0) -> list[float]:
    """RTP frame sent -> its `video.frame.ack` received, matched by pts, for events from index
    `after` on; the first `skip` acks are the connection's warm-up (keyframe, jitter buffer)."""
    latencies = []
    for event, at in zip(client.events[after:], client.event_times[after:]):
        if event["type"] == "video.frame.ack" and event["pts_ms"] is not None:
            ticks = round(event["pts_ms"] * 90)
            # aiortc's VP8 path can shift a timestamp by one 90 kHz tick (11 µs) while the rate settles
            sent = next((video.sent_at[t] for t in (ticks, ticks + 1, ticks - 1) if t in video.sent_at), None)
            if sent is not None:
                latencies.append(at - sent)
    return latencies[skip:]
