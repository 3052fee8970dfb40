"""Where the server's CPU goes, library by library, under the capacity load.

The capacity sweep's load at N sessions (`rtc_omni.bench.capacity.session_point`) against a
fresh `rtc-omni serve` that runs under `perf record` (CPU-clock samples, 499 a second). perf
records only the measured window (its control FIFO enables it when the window opens and disables
it when it closes), so start-up, connecting and the warm-up are left out, and prints each
library's share of the server's samples: how much is the interpreter running Python, and how
much the compiled codecs. The share times the per-session figure is what a library costs a
session; the figure is taken with perf attached, which adds a little.
Figures: docs/benchmarks.md, "The server's CPU by library".
Run inside the loopback namespace, as root: python -m benchmarks.server_by_library [N] [SECONDS]
"""

from __future__ import annotations

import asyncio
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from rtc_omni import patches
from rtc_omni.bench.capacity import session_point
from rtc_omni.bench.common import free_port, stop, wait_healthy

# What each library is, by the start of its file name in perf's report.
GROUPS: dict[str, tuple[str, ...]] = {
    "the Python interpreter": ("libpython",),
    "VP8 decoding (libvpx)": ("libvpx",),
    "Opus (libopus)": ("libopus",),
    "the C library (malloc, memcpy, syscall stubs)": ("libc.so", "libm.so"),
    "the kernel (sockets, scheduling)": ("[kernel",),
    "JPEG (Pillow, libjpeg)": ("_jpeg", "libjpeg", "_imaging"),
    "frame conversion (swscale, swresample, avutil)": ("libswscale", "libswresample", "libavutil"),
    "numpy": ("_multiarray", "_pocketfft", "libscipy_openblas"),
    "uvloop": ("loop.cpython",),
    "SRTP and DTLS (pylibsrtp, OpenSSL, cryptography)": ("_binding.abi3", "libcrypto", "libssl", "_rust.abi3"),
}


def shares(report: str) -> dict[str, float]:
    """Percent of samples per group from `perf report --sort dso --stdio`; the rest under "other:
    " and the three largest of its libraries."""
    totals = dict.fromkeys(GROUPS, 0.0)
    others: dict[str, float] = {}
    for line in report.splitlines():
        parts = line.split()
        if len(parts) < 2 or not parts[0].endswith("%") or line.lstrip().startswith("#"):
            continue
        percent, library = float(parts[0].rstrip("%")), parts[1]
        group = next((name for name, prefixes in GROUPS.items() if library.startswith(prefixes)), None)
        if group is None:
            others[library] = others.get(library, 0.0) + percent
        else:
            totals[group] += percent
    largest = sorted(others, key=lambda library: -others[library])[:3]
    totals["other: " + ", ".join(f"{library} {others[library]:.1f} %" for library in largest)] = sum(others.values())
    return totals


async def profile(sessions: int, seconds: float, workdir: Path) -> tuple[float, dict[str, float]]:
    """Per-session server CPU-s/s with perf attached, and each library's share of the window."""
    control, data = workdir / "control", workdir / "perf.data"
    subprocess.run(["mkfifo", str(control)], check=True)
    port = free_port()
    perf = ["perf", "record", "-e", "cpu-clock", "-F", "499", "-D", "-1", f"--control=fifo:{control}"]
    perf += ["-o", str(data), "--", sys.executable, "-m", "rtc_omni", "serve", "--host", "127.0.0.1"]
    perf += ["--port", str(port), "--synthetic-voice", "tone", "--log-level", "warning"]
    perf += ["--max-sessions", str(sessions + 1)]
    process = subprocess.Popen(perf, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def measuring(on: bool) -> None:
        with control.open("w") as fifo:
            fifo.write("enable\n" if on else "disable\n")

    url = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(url + "/healthz", process)
        point = await session_point(url, process.pid, sessions, seconds, measuring=measuring)
    finally:
        stop(process)
    report = subprocess.run(
        ["perf", "report", "-i", str(data), "--sort", "dso", "--stdio"], capture_output=True, text=True, check=True
    ).stdout
    return point.cpu_per_session, shares(report)


async def main(sessions: int, seconds: float) -> None:
    if shutil.which("perf") is None:
        sys.exit("perf is not installed (apt-get install linux-perf)")
    patches.apply()
    with tempfile.TemporaryDirectory() as workdir:
        per_session, by_group = await profile(sessions, seconds, Path(workdir))
    print(f"N={sessions}, {seconds:.0f} s: {per_session:.4f} server CPU-s/s per session (perf attached)")
    for group, percent in sorted(by_group.items(), key=lambda item: -item[1]):
        print(f"  {percent:5.1f} %  {per_session * percent / 100:.4f}  {group}")


if __name__ == "__main__":
    arguments = [float(a) for a in sys.argv[1:3]]
    asyncio.run(main(int(arguments[0]) if arguments else 8, arguments[1] if len(arguments) > 1 else 25.0))
