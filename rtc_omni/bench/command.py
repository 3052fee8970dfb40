"""`rtc-omni bench`: arguments and the run; kept apart so `rtc_omni.cli` stays thin."""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import importlib.util
import shlex
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # the parser is built on every `rtc-omni` call; the run imports aiortc
    from .run import Plan

MODES = {"understand": ("understand",), "realtime": ("realtime",), "both": ("understand", "realtime")}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--quick", action="store_true", help="a smoke run of every item, small samples, about 40 s")
    parser.add_argument("--json", type=Path, help="write the figures and raw samples here")
    parser.add_argument("--plots", type=Path, help="draw latency.png and capacity.png into this folder")
    parser.add_argument("--seconds", type=float, help="length of each ingest and WebSocket run")
    parser.add_argument("--capacity-seconds", type=float, help="length of each capacity point, after 2 s of warm-up")
    parser.add_argument("--max-sessions", type=int, help="largest N of sessions in the capacity sweep")
    parser.add_argument(
        "--mode",
        choices=sorted(MODES),
        default="understand",
        help="the capacity sweep's sessions: understanding (/v1/rtc/offer), realtime calls (/v1/realtime/calls), "
        "or both side by side (default: understand)",
    )
    parser.add_argument(
        "--peer-python", help="interpreter with pipecat-ai[webrtc] for the pipecat comparison (default: this one)"
    )
    parser.add_argument("--no-peer", action="store_true", help="skip the comparison with pipecat's WebRTC server")
    parser.add_argument(
        "--sessions-only",
        action="store_true",
        help="only the capacity sweep of --mode's sessions and the pipecat comparison (a few minutes)",
    )
    parser.add_argument(
        "--server-args",
        default="",
        metavar="ARGS",
        help="extra `rtc-omni serve` arguments for the capacity sweep's server, e.g. --server-args='--workers 2'",
    )


def plan_from(args: argparse.Namespace) -> Plan:
    from . import run

    plan = run.QUICK if args.quick else run.FULL
    changes: dict[str, Any] = {"modes": MODES[args.mode]}
    if args.seconds is not None:
        changes["seconds"] = args.seconds
    if args.capacity_seconds is not None:
        changes["capacity_seconds"] = args.capacity_seconds
    if args.max_sessions is not None:
        changes["session_counts"] = tuple(n for n in plan.session_counts if n <= args.max_sessions)
    if args.peer_python is not None:
        changes["peer_python"] = args.peer_python
    if args.no_peer:
        changes["peer_python"] = None
    if args.sessions_only:
        changes["sessions_only"] = True
    if args.server_args:
        changes["server_args"] = tuple(shlex.split(args.server_args))
    return dataclasses.replace(plan, **changes)


def main(args: argparse.Namespace) -> int:
    if args.plots and importlib.util.find_spec("matplotlib") is None:  # say so now, not after the run
        print("rtc-omni: --plots needs matplotlib: pip install 'rtc-omni[bench]'", file=sys.stderr)
        return 2
    from .. import patches
    from . import report, run

    patches.apply()  # the headless peers gather on 127.0.0.1 only
    plan = plan_from(args)
    started = time.monotonic()

    def progress(step: str) -> None:
        print(f"[{time.monotonic() - started:5.1f} s] {step}", file=sys.stderr, flush=True)

    result = asyncio.run(run.run(plan, progress))
    progress("done")
    print(report.table(result))
    if args.json:
        report.write_json(result, args.json)
        print(f"figures written to {args.json}")
    if args.plots:
        for path in report.write_plots(result, args.plots):
            print(f"plot written to {path}")
    return 0
