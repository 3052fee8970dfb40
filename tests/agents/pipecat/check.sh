#!/usr/bin/env bash
# Exits 0 when DIR holds exactly requirements.txt's pins and imports what agent.py uses.
set -euo pipefail
DIR="${1:?usage: check.sh DIR}"
HERE="$(cd "$(dirname "$0")" && pwd)"
pins() { grep -v '^#' "$1" | sed 's/\[[^]]*\]//' | tr '[:upper:]_' '[:lower:]-' | sort; }
diff <(pins "$HERE/requirements.txt") <("$DIR/bin/pip" freeze | pins /dev/stdin)
"$DIR/bin/python" -c "import pipecat.services.openai.realtime.llm, pipecat.workers.runner"
