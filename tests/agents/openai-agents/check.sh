#!/usr/bin/env bash
# Exits 0 when DIR holds the pinned openai-agents with what voice_agent.py imports.
set -euo pipefail
DIR="${1:?usage: check.sh DIR}"
"$DIR/bin/python" - <<'PY'
from importlib import metadata

import websockets  # noqa: F401  (the realtime WebSocket transport)
from agents.realtime import RealtimeAgent, RealtimeRunner  # noqa: F401

assert metadata.version("openai-agents") == "0.24.0", metadata.version("openai-agents")
PY
