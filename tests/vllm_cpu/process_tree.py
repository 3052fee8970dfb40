"""The processes of `rtc-omni serve --engine vllm --workers N`, read from /proc: which one is the
engine process, which loaded torch, and whether all of them are gone (tests/test_vllm_cpu_*.py)."""

from __future__ import annotations

import time
from pathlib import Path

ENGINE_MARK = "rtc_omni.workers.engine_process"
STOP_TIMEOUT_S = 120  # the supervisor's health check, then the engine's stop (its stage processes)


def process_tree(root: int) -> dict[int, list[int]]:
    """Each live process under `root` (itself included) with its children."""
    tree: dict[int, list[int]] = {}
    pending = [root]
    while pending:
        pid = pending.pop()
        children: list[int] = []
        try:
            for task in Path(f"/proc/{pid}/task").iterdir():
                children += [int(child) for child in (task / "children").read_text().split()]
        except OSError:
            continue  # it just exited
        tree[pid] = children
        pending += children
    return tree


def subtree(tree: dict[int, list[int]], root: int) -> set[int]:
    found, pending = set(), [root]
    while pending:
        pid = pending.pop()
        found.add(pid)
        pending += tree.get(pid, [])
    return found


def loaded_torch(pid: int) -> bool:
    try:
        return "libtorch_cpu.so" in Path(f"/proc/{pid}/maps").read_text()
    except OSError:
        return False


def is_engine_process(pid: int) -> bool:
    try:
        return ENGINE_MARK in Path(f"/proc/{pid}/cmdline").read_text(errors="replace")
    except OSError:
        return False


def assert_all_gone(pids: set[int]) -> None:
    """Every process of `pids` exits within STOP_TIMEOUT_S: nothing of the server is left behind."""
    deadline = time.monotonic() + STOP_TIMEOUT_S
    while (left := {pid for pid in pids if Path(f"/proc/{pid}").exists()}) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert not left, [Path(f"/proc/{pid}/cmdline").read_text(errors="replace")[:200] for pid in left]
