#!/usr/bin/env bash
# Start coturn in the foreground with turn/turnserver.<prod|test>.conf; further arguments are
# passed to turnserver and override the file (e.g. --static-auth-secret=..., --listening-port=...).
set -euo pipefail
mode="${1:-}"
case "$mode" in
prod | test) shift ;;
*)
    echo "usage: $0 prod|test [turnserver options...]" >&2
    exit 2
    ;;
esac
command -v turnserver >/dev/null || { echo "turnserver not found: apt-get install coturn" >&2; exit 1; }
exec turnserver -c "$(dirname "$0")/turnserver.$mode.conf" "$@"
