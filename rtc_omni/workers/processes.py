"""Helpers for the processes the parent of `--workers N` starts: the workers and the engine process."""

from __future__ import annotations

import signal
import sys

PR_SET_PDEATHSIG = 1  # linux/prctl.h


def die_with_parent() -> None:
    """Have the kernel SIGTERM this process when its parent dies, even by SIGKILL (Linux only)."""
    if sys.platform == "linux":
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)


def describe_exit(code: int | None) -> str:
    """How a child process ended, for a log line: `was killed by SIGKILL`, `exited with status 2`."""
    if code is not None and code < 0:
        return f"was killed by {signal.Signals(-code).name}"
    return f"exited with status {code}"
