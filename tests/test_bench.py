"""`rtc-omni bench` parses its arguments and its measurements run; no timed assertions (figures are
printed by the benchmark, not asserted here)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rtc_omni.bench import report, run, understand, websocket
from rtc_omni.bench.cli import plan_from
from rtc_omni.cli import build_parser


def test_bench_arguments_choose_the_plan() -> None:
    args = build_parser().parse_args(["bench", "--quick", "--json", "out.json", "--max-sessions", "1", "--no-peer"])
    plan = plan_from(args)
    assert args.json == Path("out.json")
    assert plan.understand_sessions == (1,) and plan.peer_python is None
    assert plan_from(build_parser().parse_args(["bench"])) == run.FULL


@pytest.mark.media
async def test_one_tiny_measurement_of_each_transport(server, tmp_path: Path) -> None:
    connect = await understand.measure_connect(server.url, 1)
    assert len(connect.connected_s) == 1 and len(connect.first_ack_s) == 1
    ws = await websocket.measure_websocket_ingest(server.url, 1.0)
    assert ws.payload_bytes_per_s > 0
    result = run.Result(run.machine(), samples={"offer -> connected": connect.connected_s})
    result.figures["capacity"] = {"understand": [], "generate": []}
    report.write_json(result, tmp_path / "bench.json")
    assert json.loads((tmp_path / "bench.json").read_text())["samples_s"]["offer -> connected"]
