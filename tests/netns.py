"""Guard for tests whose peers cannot be restricted to 127.0.0.1 (FFmpeg's WHIP muxer, coturn).

They run only inside a loopback-only network namespace; under CI (CI=true, which runs the suite in
one) a missing namespace is a failure, elsewhere a skip.
"""

from __future__ import annotations

import os

import pytest


def require_loopback_namespace() -> None:
    if set(os.listdir("/sys/class/net")) == {"lo"}:
        return
    message = "needs a loopback-only network namespace (see .ci/run)"
    if os.environ.get("CI") == "true":
        pytest.fail(message)
    pytest.skip(message)
