#!/usr/bin/env bash
# pipecat-ai 1.14's OpenAI Realtime service in an environment of its own (tests/agents/README.md):
# a virtual environment at DIR with requirements.txt's pins, checked by check.sh.
set -euo pipefail
DIR="${1:?usage: build.sh DIR}"
HERE="$(cd "$(dirname "$0")" && pwd)"
python3 -m venv "$DIR"
"$DIR/bin/pip" install -q -r "$HERE/requirements.txt"
bash "$HERE/check.sh" "$DIR"
