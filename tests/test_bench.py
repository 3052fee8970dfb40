"""`rtc-omni bench` parses its arguments and its measurements run; no timed assertions (figures are
printed by the benchmark, not asserted here)."""

from __future__ import annotations

import json
import os
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest
from aiortc.codecs.vpx import vp8_depayload
from aiortc.rtcdtlstransport import RTCDtlsTransport
from aiortc.rtp import RtpPacket, is_rtcp

from rtc_omni.bench import capacity, replay, report, run, understand_latency, websocket_baseline
from rtc_omni.bench.command import plan_from
from rtc_omni.cli import build_parser
from rtc_omni.client.media import camera_send_bitrate
from rtc_omni.client.rtc_peers import UnderstandClient
from rtc_omni.config import Settings, load_settings

from .conftest import ServerFactory


def test_bench_arguments_choose_the_plan() -> None:
    args = build_parser().parse_args(["bench", "--quick", "--json", "out.json", "--max-sessions", "1", "--no-peer"])
    plan = plan_from(args)
    assert args.json == Path("out.json")
    assert plan.session_counts == (1,) and plan.peer_python is None and plan.modes == ("understand",)
    assert plan_from(build_parser().parse_args(["bench"])) == run.FULL
    both = plan_from(build_parser().parse_args(["bench", "--sessions-only", "--mode", "both"]))
    assert both.modes == ("understand", "realtime") and set(both.modes) <= set(capacity.MODES)
    sweep = plan_from(build_parser().parse_args(["bench", "--sessions-only", "--server-args=--workers 2"]))
    assert sweep.sessions_only and sweep.server_args == ("--workers", "2")


def test_the_sweep_server_admits_every_session_of_one_address_and_the_users_arguments_win() -> None:
    def settings(plan: run.Plan) -> Settings:
        return load_settings(build_parser().parse_args(["serve", *run.sweep_server_args(plan)]), environ={})

    full = settings(run.FULL)  # 64 sessions at most, all from 127.0.0.1: the defaults would refuse some
    assert (full.max_sessions, full.max_connections_per_client, full.session_rate_limit) == (128, 128, 0)
    mine = settings(run.Plan(server_args=("--workers", "2", "--max-sessions", "10")))
    assert (mine.workers, mine.max_sessions) == ("2", 10)


def _sweep_point(sessions: int, ok: bool) -> dict[str, Any]:
    return {
        "sessions": sessions,
        "ok": ok,
        "server_cpu_s_per_s_per_session": 0.04,
        "ingest_p50_ms": 6.0,
        "ingest_p95_ms": 9.0 if ok else 150.0,
        "turns_completed": 3 * sessions,
        "turns_sent": 3 * sessions,
        "min_fps": None,
        "client_cpu_s_per_s": 0.1,
    }


def test_the_report_says_when_the_sweep_found_no_limit() -> None:
    def largest(points: list[dict[str, Any]], max_understand: int) -> str:
        cap = {"idle_server_cpu_s_per_s": 0.0, "modes": ["understand"], "understand": points, "generate": []}
        cap["max_understand"] = max_understand
        return dict(report.rows(run.Result({}, figures={"capacity": cap})))[
            "4 capacity: largest N understanding sessions passing"
        ]

    assert largest([_sweep_point(16, True), _sweep_point(20, False)], 16) == "16"
    assert (
        largest([_sweep_point(16, True), _sweep_point(20, True)], 20)
        == "20 (every N swept passed: the limit is higher)"
    )


def test_the_report_puts_both_modes_side_by_side_and_beside_pipecat() -> None:
    realtime = [{**_sweep_point(n, True), "ingest_p50_ms": None, "ingest_p95_ms": None} for n in (1, 2)]
    cap = {"idle_server_cpu_s_per_s": 0.0, "modes": ["understand", "realtime"], "generate": []}
    cap |= {"understand": [_sweep_point(1, True), _sweep_point(2, True)], "max_understand": 2}
    cap |= {"realtime": realtime, "max_realtime": 2}
    pipecat = {"sessions": 1, "server_cpu_s_per_s_per_session": 0.08, "echo_heard": 1}
    pipecat |= {"rtc_omni_server_cpu_s_per_s_per_session": {"understand": 0.04, "realtime": 0.05}}
    pipecat |= {"ratio": {"understand": 2.0, "realtime": 1.6}}
    peer = {"name": "pipecat", "points": [pipecat]}
    rows = report.rows(run.Result({}, figures={"capacity": cap, "peer": peer}))

    names = [name.removeprefix("4 capacity: ") for name, _ in rows if "replayed peers" in name]
    assert names == [f"{n} {kind} sessions (replayed peers)" for n in (1, 2) for kind in ("understanding", "realtime")]
    assert dict(rows)["4 capacity: 2 realtime sessions (replayed peers)"].endswith("turns 6/6 (client 0.10 CPU-s/s) ok")
    assert dict(rows)["4 capacity: largest N realtime sessions passing"].startswith("2 ")
    assert dict(rows)["6b pipecat, 1 replayed sessions: server CPU-s/s per session"] == (
        "0.080 vs rtc-omni understanding 0.040 (x2.0), realtime 0.050 (x1.6) (echo heard by 1/1; asyncio)"
    )


async def test_pipecat_is_compared_with_every_mode_of_the_sweep(monkeypatch: pytest.MonkeyPatch) -> None:
    async def pipecat(python: str, sessions: int, seconds: float) -> dict[str, Any]:
        return {"sessions": sessions, "server_cpu_s_per_s_per_session": 0.1}

    monkeypatch.setattr(run.pipecat_peer, "unavailable", lambda python: None)
    monkeypatch.setattr(run.pipecat_peer, "measure", pipecat)
    point = {"sessions": 1, "server_cpu_s_per_s_per_session": 0.04}
    cap = {"understand": [point], "realtime": [{**point, "server_cpu_s_per_s_per_session": 0.05}]}
    plan = run.Plan(modes=("understand", "realtime"), peer_sessions=(1,))
    figures = await run._peer(plan, "python", cap, lambda step: None)
    assert figures["points"][0]["ratio"] == {"understand": 2.5, "realtime": 2.0}


@pytest.mark.media
async def test_a_realtime_call_of_the_sweep_is_answered(make_server: ServerFactory) -> None:
    """One replayed peer of `/v1/realtime/calls`: it asks once in a 1 s window and its answer (one
    spoken sentence, ~1.3 s) completes."""
    server = await make_server(spoken_sentences=1)
    point = await capacity.session_point(server.url, os.getpid(), 1, 1.0, mode=capacity.MODES["realtime"])
    assert (point.turns_sent, point.turns_completed, point.ingest_p95_ms, point.ok) == (1, 1, None, True)


def test_plots_without_matplotlib_fail_before_the_run(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    from rtc_omni.bench import command

    async def no_run(plan: run.Plan, progress: object) -> None:  # the run must not start
        raise AssertionError("the benchmark ran")

    monkeypatch.setattr(run, "run", no_run)
    monkeypatch.setattr(command.importlib.util, "find_spec", lambda name: None if name == "matplotlib" else object())
    args = build_parser().parse_args(["bench", "--quick", "--plots", str(tmp_path)])
    assert command.main(args) == 2
    assert "--plots needs matplotlib: pip install 'rtc-omni[bench]'" in capsys.readouterr().err


async def _outbound_ssrcs(client: UnderstandClient) -> dict[str, int]:
    report = await client.pc.getStats()
    return {s.kind: s.ssrc for s in report.values() if s.type == "outbound-rtp"}


def _video_frames(packets: list[RtpPacket]) -> list[bytes]:
    """The VP8 frames a stream carried, without the per-sender payload descriptors, in order."""
    frames: list[bytes] = []
    part = b""
    for packet in sorted(packets, key=lambda p: p.sequence_number):
        part += vp8_depayload(packet.payload)
        if packet.marker:
            frames.append(part)
            part = b""
    return frames


@pytest.mark.media
async def test_replaying_peers_send_the_loop_under_their_own_ssrcs(server, monkeypatch) -> None:
    """Two load-generator peers send the same pre-encoded camera and mic, each under its own SSRC,
    and the server decodes and samples the camera of both; the mic in the 60 ms packets the
    server's answer asks for, as Chromium sends them."""
    sent: dict[int, list[RtpPacket]] = defaultdict(list)
    send_rtp = RTCDtlsTransport._send_rtp

    async def recording_send_rtp(self: RTCDtlsTransport, data: bytes) -> Any:
        if not is_rtcp(data):
            packet = RtpPacket.parse(data)
            if len(sent[packet.ssrc]) < 1000:
                sent[packet.ssrc].append(packet)
        return await send_rtp(self, data)

    monkeypatch.setattr(RTCDtlsTransport, "_send_rtp", recording_send_rtp)
    clients = [replay.replaying_client(server.url, UnderstandClient) for _ in range(2)]
    try:
        for client in clients:
            await client.connect()
            await client.configure(enable_frame_filter=False)
        for client in clients:  # two sampled frames: half a second of camera at the default 2 fps
            first = await client.wait_event("video.frame.ack")
            await client.wait_event("video.frame.ack", after=client.events.index(first) + 1)
        ssrcs = [await _outbound_ssrcs(client) for client in clients]
    finally:
        for client in clients:
            await client.close()

    assert ssrcs[0]["video"] != ssrcs[1]["video"] and ssrcs[0]["audio"] != ssrcs[1]["audio"]
    camera, mic = replay.encode_camera(replay.CAMERA_FPS), replay.encode_mic(60)
    for peer in ssrcs:
        frames = _video_frames(sent[peer["video"]])
        assert len(frames) >= 4 and frames == list(camera.frames[: len(frames)])  # ~1 s at 5 fps
        audio = [p.payload for p in sent[peer["audio"]]]
        assert len(audio) >= 8 and audio == list(mic.frames[: len(audio)])


def test_a_replayed_mic_uses_the_packet_time_the_answer_asks() -> None:
    audio = "v=0\r\nm=video 9 UDP/TLS/RTP/SAVPF 96\r\na=ptime:60\r\nm=audio 9 UDP/TLS/RTP/SAVPF 111\r\n"
    assert replay.mic_packet_ms(None) == 20  # no answer yet
    assert replay.mic_packet_ms(audio) == 20  # pipecat's answers ask nothing: a browser's 20 ms
    assert replay.mic_packet_ms(audio + "a=ptime:60\r\n") == 60
    assert replay.mic_packet_ms(audio + "a=ptime:50\r\n") == 40  # the longest Opus packet that fits
    assert replay.mic_packet_ms(audio + "a=ptime:10\r\n") == 20
    assert replay.encode_mic(60).ticks == 2880 and len(replay.encode_mic(60).frames) == 4 * 1000 // 60


def test_the_replayed_camera_sends_what_the_page_sends() -> None:
    camera = replay.encode_camera(replay.CAMERA_FPS)
    assert len(camera.frames) == replay.CAMERA_FPS * replay.LOOP_SECONDS
    wanted = camera_send_bitrate(replay.CAMERA_FPS)  # 150 kb/s at 5 fps, the page's maxBitrate
    assert abs(camera.bytes_per_second * 8 - wanted) <= replay.RATE_TOLERANCE * wanted


@pytest.mark.media
async def test_one_tiny_measurement_of_each_transport(server, tmp_path: Path) -> None:
    connect = await understand_latency.measure_connect(server.url, 1)
    assert len(connect.connected_s) == 1 and len(connect.first_ack_s) == 1
    ws = await websocket_baseline.measure_websocket_ingest(server.url, 1.0)
    assert ws.payload_bytes_per_s > 0
    result = run.Result(run.machine(), samples={"offer -> connected": connect.connected_s})
    result.figures["capacity"] = {"understand": [], "generate": []}
    report.write_json(result, tmp_path / "bench.json")
    assert json.loads((tmp_path / "bench.json").read_text())["samples_s"]["offer -> connected"]
