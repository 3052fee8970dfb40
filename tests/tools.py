"""What a test needs from outside Python (coturn, espeak-ng, Chromium, FFmpeg's WHIP muxer, HAProxy, a loopback-only
network namespace, the vLLM-Omni environment), and what happens when it is missing.

A fresh machine runs the whole suite green: a test whose tool is missing skips and names the install
command. Under CI (`CI=true`, set by .ci/run, which installs everything) a missing tool is a failure,
so nothing CI should prove is skipped away.
"""

from __future__ import annotations

import os
import shutil
import socket
from typing import NoReturn

import pytest


def under_ci() -> bool:
    return os.environ.get("CI", "").lower() in ("1", "true", "yes")


def unavailable(reason: str) -> NoReturn:
    """Skip with the reason (which says how to get what is missing); under CI, fail with it."""
    if under_ci():
        pytest.fail(f"cannot run under CI: {reason}")
    pytest.skip(reason)


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago, for a server that cannot report the one it bound."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def require_tool(command: str, install: str) -> str:
    """The path of `command` on PATH; if there is none, skip (fail under CI) naming `install`."""
    path = shutil.which(command)
    if path is None:
        unavailable(f"{command} is not installed ({install})")
    return path


def require_loopback_namespace() -> None:
    """For tests whose peers cannot be restricted to 127.0.0.1 (Chromium, FFmpeg's WHIP muxer, coturn, vLLM)."""
    interfaces = set(os.listdir("/sys/class/net"))
    if interfaces != {"lo"}:
        unavailable(
            f"needs a loopback-only network namespace, this one has {sorted(interfaces)}: "
            "ip netns add rtcomni; ip netns exec rtcomni ip link set lo up; "
            "ip netns exec rtcomni python -m pytest"
        )


AGENTS_DIR = os.environ.get("RTC_OMNI_AGENTS_DIR", "/tmp/rtc-omni-agents")


def agent_env(name: str) -> str:
    """The folder of agent framework `name`'s environment (tests/agents/README.md); if it is not
    built, skip (fail under CI) naming the command that builds it."""
    folder = os.path.join(AGENTS_DIR, name)
    if not os.path.isdir(folder):
        unavailable(f"the {name} environment is not built (bash tests/agents/env.sh {name} {folder})")
    return folder
