#!/usr/bin/env bash
# openai-agents in a virtual environment of its own: bash build.sh DIR (tests/agents/README.md).
set -euo pipefail
DIR="${1:?usage: build.sh DIR}"
HERE="$(cd "$(dirname "$0")" && pwd)"
python3 -m venv "$DIR"
"$DIR/bin/pip" install -q --disable-pip-version-check -r "$HERE/requirements.txt"
bash "$HERE/check.sh" "$DIR"
