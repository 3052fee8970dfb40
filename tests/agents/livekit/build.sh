#!/usr/bin/env bash
# LiveKit Agents' OpenAI realtime plugin in a virtual environment of its own (tests/agents/README.md):
#
#   bash tests/agents/livekit/build.sh DIR    # about a minute, 420 MB
set -euo pipefail
VENV="${1:?usage: build.sh DIR}"
HERE="$(cd "$(dirname "$0")" && pwd)"

"${PYTHON:-python3}" -m venv "$VENV"
"$VENV/bin/pip" install -q --no-deps -r "$HERE/requirements.txt"
"$VENV/bin/pip" check
bash "$HERE/check.sh" "$VENV"
echo "ready: $VENV/bin/python $HERE/agent.py BASE_URL text"
