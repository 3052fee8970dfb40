"""Helpers shared by the benchmark scripts: the server subprocess, CPU accounting, percentiles."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import urllib.request

from rtc_omni.client.media import AudioRecorder

CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q / 100 * (len(ordered) - 1))))]


def summary(values: list[float], unit: str = "ms", scale: float = 1000.0) -> str:
    if not values:
        return "no samples"
    return (
        f"p50 {percentile(values, 50) * scale:.1f} {unit}, p95 {percentile(values, 95) * scale:.1f} {unit}, "
        f"n={len(values)}"
    )


def process_cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS


def start_server(extra_args: list[str] | None = None) -> tuple[subprocess.Popen, str]:
    """`rtc-omni serve` on a free loopback port, ready to take offers."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "rtc_omni",
            "serve",
            "--port",
            str(port),
            "--synthetic-voice",
            "tone",
            "--log-level",
            "warning",
            *(extra_args or []),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        try:
            urllib.request.urlopen(url + "/healthz", timeout=1).read()
            return process, url
        except OSError:
            time.sleep(0.05)
    process.kill()
    raise RuntimeError("server did not start")


def silent_from(recorder: AudioRecorder, since: float, run: int = 3) -> float | None:
    """Arrival time of the first of `run` consecutive silent frames after `since`."""
    frames = [f for f in recorder.frames if f.at >= since]
    for i in range(len(frames) - run + 1):
        if all(f.rms < recorder.SILENCE_RMS for f in frames[i : i + run]):
            return frames[i].at
    return None
