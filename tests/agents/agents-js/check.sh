#!/usr/bin/env bash
# Exit 0 when DIR holds the app built from this folder's files as they are now (tests/agents/README.md).
set -euo pipefail
DIR="${1:?usage: check.sh DIR}"
HERE="$(cd "$(dirname "$0")" && pwd)"
[ -s "$DIR/site/app.js" ] && [ -s "$DIR/site/index.html" ]
(cd "$HERE" && sha256sum --check --quiet --strict "$DIR/built-from.sha256")
