#!/usr/bin/env bash
# Exit 0 when DIR holds the environment build.sh makes: the pinned plugin imports with what agent.py uses.
set -euo pipefail
VENV="${1:?usage: check.sh DIR}"
"$VENV/bin/python" - <<'PY'
from importlib import metadata

from livekit.agents import Agent, AgentSession, function_tool  # noqa: F401
from livekit.plugins import openai  # noqa: F401

assert metadata.version("livekit-plugins-openai") == "1.8.9", metadata.version("livekit-plugins-openai")
PY
