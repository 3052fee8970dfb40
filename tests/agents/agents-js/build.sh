#!/usr/bin/env bash
# The browser app of tests/browser/test_agents_js.py: @openai/agents-realtime and esbuild from
# package-lock.json (npm ci), app.js bundled for Chromium into DIR/site beside index.html.
#
#   bash tests/agents/agents-js/build.sh DIR
set -euo pipefail
DIR="${1:?usage: build.sh DIR}"
HERE="$(cd "$(dirname "$0")" && pwd)"
SOURCES=(package.json package-lock.json agent.js app.js index.html build.sh)
mkdir -p "$DIR/site"
rm -f "$DIR/built-from.sha256"
cp "$HERE/package.json" "$HERE/package-lock.json" "$HERE/agent.js" "$HERE/app.js" "$DIR/"
# No install scripts: esbuild's only checks its binary, which comes as the @esbuild/<platform> package.
(cd "$DIR" && npm ci --ignore-scripts --no-audit --no-fund)
(cd "$DIR" && node_modules/.bin/esbuild app.js --bundle --platform=browser --format=esm --target=chrome120 \
    --outfile=site/app.js --log-level=warning)
cp "$HERE/index.html" "$DIR/site/"
(cd "$HERE" && sha256sum "${SOURCES[@]}") >"$DIR/built-from.sha256"
bash "$HERE/check.sh" "$DIR"
