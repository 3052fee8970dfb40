#!/usr/bin/env bash
# An environment of its own for one agent framework, so that its dependencies never meet rtc-omni's
# or another framework's: tests/test_agents_*.py run the framework's own code from it against a
# server under test.
#
#   bash tests/agents/env.sh NAME DIR    # NAME: a folder of tests/agents/ holding build.sh
#
# Each tests/agents/NAME/build.sh DIR builds into DIR from pinned versions (registries only) and
# ends with a check that imports what its test uses. .ci/run builds every NAME under
# $RTC_OMNI_AGENTS_DIR (default /tmp/rtc-omni-agents) unless its check already passes.
set -euo pipefail
NAME="${1:?usage: env.sh NAME DIR}"
DIR="${2:?usage: env.sh NAME DIR}"
HERE="$(cd "$(dirname "$0")" && pwd)"
[ -f "$HERE/$NAME/build.sh" ] || { echo "no framework $NAME (tests/agents/$NAME/build.sh)" >&2; exit 2; }
bash "$HERE/$NAME/build.sh" "$DIR"
