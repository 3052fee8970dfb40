"""The whole benchmark: each measurement in turn against fresh loopback servers, as one result."""

from __future__ import annotations

import os
import platform
import sys
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

import aiortc

from . import capacity, generate_throughput, pipecat_peer, understand_latency, websocket_baseline
from .common import server, stats_ms


@dataclass(frozen=True)
class Plan:
    """How much of each measurement to run; bounded in count and time."""

    seconds: float = 15.0  # each ingest and WebSocket run
    connects: int = 10
    interrupts: int = 8
    audio_turns: int = 8
    generate_seconds: float = 20.0
    generate_chunks: int = 15
    # Past where a 2-core machine fails (one worker: 28 passed, 32 failed; two: 64 passed on a faster VM, both
    # on 2026-12-02); the sweep stops at the first failure.
    session_counts: tuple[int, ...] = (1, 2, 4, 6, 8, 12, 16, 20, 24, 28, 32, 40, 48, 56, 64)
    modes: tuple[str, ...] = ("understand",)  # the capacity sweep's session kinds: capacity.MODES
    generate_streams: tuple[int, ...] = (1, 2, 4)
    capacity_seconds: float = 15.0
    codecs: tuple[str, ...] = ("vp8", "h264")
    peer_python: str | None = sys.executable  # an interpreter with pipecat; None skips the pipecat comparison
    peer_sessions: tuple[int, ...] = (1, 8)  # N of the pipecat comparison: one session, and many
    server_args: tuple[str, ...] = ()  # extra `rtc-omni serve` arguments of the capacity sweep's server
    sessions_only: bool = False  # only the capacity sweep of `modes` and the pipecat comparison


FULL = Plan()
QUICK = Plan(
    seconds=3.0,
    connects=3,
    interrupts=2,
    audio_turns=2,
    generate_seconds=2.0,
    generate_chunks=2,
    session_counts=(1, 2),
    generate_streams=(1,),
    capacity_seconds=3.0,
    codecs=("vp8",),
    peer_python=None,
    peer_sessions=(1, 2),
)
IDLE_SECONDS = 3.0


@dataclass
class Result:
    machine: dict[str, Any]
    figures: dict[str, Any] = field(default_factory=dict)  # what the table and JSON show
    samples: dict[str, list[float]] = field(default_factory=dict)  # raw latencies in s, for plots


def machine() -> dict[str, Any]:
    return {
        "cores": os.cpu_count(),
        "cpu": platform.processor() or platform.machine(),
        "python": sys.version.split()[0],
        "aiortc": aiortc.__version__,
        "load_average_at_start": os.getloadavg(),
    }


def _latency(result: Result, name: str, values: list[float]) -> dict[str, float]:
    result.samples[name] = values
    return stats_ms(values)


async def run(plan: Plan, progress: Callable[[str], None] = print) -> Result:
    result = Result(machine())
    if not plan.sessions_only:
        await _latencies(plan, result, progress)
    result.figures["capacity"] = await _capacity(plan, result, progress)
    if plan.peer_python is not None:
        result.figures["peer"] = await _peer(plan, plan.peer_python, result.figures["capacity"], progress)
    return result


async def _latencies(plan: Plan, result: Result, progress: Callable[[str], None]) -> None:
    """One session at a time: connect, ingest, WebSocket, engine to wire, interrupt, generation."""
    fig = result.figures
    with server() as (_, url):
        progress("connect")
        connect = await understand_latency.measure_connect(url, plan.connects)
        fig["connect"] = {
            "offer_to_connected_ms": _latency(result, "offer -> connected", connect.connected_s),
            "offer_to_first_ack_ms": _latency(result, "offer -> first ack", connect.first_ack_s),
        }
        fig["ingest"] = {}
        for codec in plan.codecs:
            progress(f"ingest {codec}")
            ingest = await understand_latency.measure_ingest(url, codec, plan.seconds)
            fig["ingest"][codec] = {
                "frame_to_ack_ms": _latency(result, f"RTP frame -> ack ({codec})", ingest.ack_s),
                "payload_bytes_per_s": round(ingest.payload_bytes_per_s),
            }
        progress("WebSocket ingest")
        ws = await websocket_baseline.measure_websocket_ingest(url, plan.seconds)
        webrtc = fig["ingest"]["vp8"]
        ws_ack = _latency(result, "WebSocket frame -> ack", ws.ack_s)
        fig["websocket"] = {
            "frame_to_ack_ms": ws_ack,
            "payload_bytes_per_s": round(ws.payload_bytes_per_s),
            "bytes_ratio_ws_to_webrtc": round(ws.payload_bytes_per_s / webrtc["payload_bytes_per_s"], 2),
            "ack_p50_ratio_ws_to_webrtc": _ratio(ws_ack, webrtc["frame_to_ack_ms"], "p50"),
            "ack_p95_ratio_ws_to_webrtc": _ratio(ws_ack, webrtc["frame_to_ack_ms"], "p95"),
        }
        progress("engine audio -> peer")
        audio = await understand_latency.measure_audio_out(url, plan.audio_turns)
        fig["engine_to_wire"] = {"audio_chunk_to_decoded_ms": _latency(result, "engine audio -> decoded", audio)}
        progress("interrupt")
        interrupts = await understand_latency.measure_interrupt(url, plan.interrupts)
        fig["interrupt_to_silence_ms"] = _latency(result, "interrupt -> silence", interrupts)
    fig["generate"] = {}
    for codec in plan.codecs:
        progress(f"generate {codec}")
        stream = await generate_throughput.measure_throughput(codec, plan.generate_seconds)
        frames = await generate_throughput.measure_frame_latency(codec, plan.generate_chunks)
        fig["generate"][codec] = asdict(stream)
        fig["engine_to_wire"][f"video_frame_to_decoded_{codec}_ms"] = _latency(
            result, f"engine video -> decoded ({codec})", frames
        )


def _ratio(a: dict[str, float], b: dict[str, float], key: str) -> float | None:
    return round(a[key] / b[key], 2) if a.get("n") and b.get("n") and b[key] else None


def sweep_server_args(plan: Plan) -> list[str]:
    """The capacity server's arguments: room for the sweep's largest N, then `plan.server_args` (which
    win). Every replayed peer comes from 127.0.0.1, so the per-client limits would count them all as
    one client; twice the largest N leaves room for the previous N's sessions while they close."""
    room = str(2 * max(plan.session_counts + plan.peer_sessions))
    limits = ["--max-sessions", room, "--max-connections-per-client", room, "--session-rate-limit", "0"]
    return [*limits, *plan.server_args]


async def _capacity(plan: Plan, result: Result, progress: Callable[[str], None]) -> dict[str, Any]:
    """Sweep N upwards in each of `plan.modes` on one server, then the generation streams on another."""
    out: dict[str, Any] = {"modes": list(plan.modes), "generate": [], "max_generate": 0}
    out["server_args"] = list(plan.server_args)
    with server(sweep_server_args(plan)) as (process, url):
        progress("capacity: idle server")
        idle = out["idle_server_cpu_s_per_s"] = round(await capacity.idle_cpu(process.pid, IDLE_SECONDS), 3)
        await _sweep_sessions(plan, url, process.pid, idle, out, result, progress)
    if plan.sessions_only:
        return out
    with server([*plan.server_args, *generate_throughput.FAST_ENGINE]) as (process, url):
        for n in plan.generate_streams:
            progress(f"capacity: {n} generation streams")
            point = await capacity.generate_point(url, process.pid, n, plan.capacity_seconds)
            out["generate"].append(_point(point))
            if not point.ok:
                break
            out["max_generate"] = n
    return out


async def _sweep_sessions(
    plan: Plan, url: str, pid: int, idle: float, out: dict[str, Any], result: Result, progress: Callable[[str], None]
) -> None:
    """Every mode at one N, then the next N, so the modes are measured side by side under the same
    load from elsewhere; a mode stops at its first N that fails (a turn lost, ingest p95 >= 100 ms)."""
    passing = list(plan.modes)
    for name in passing:
        out[name], out[f"max_{name}"] = [], 0
    for n in plan.session_counts:
        for name in tuple(passing):
            mode = capacity.MODES[name]
            progress(f"capacity: {n} {mode.noun} sessions")
            point = await capacity.session_point(url, pid, n, plan.capacity_seconds, mode=mode)
            out[name].append(_point(point, idle))
            if point.ingest_s:
                result.samples[f"ingest, N={n} sessions"] = point.ingest_s
            if point.ok:
                out[f"max_{name}"] = n
            else:
                passing.remove(name)
        if not passing:
            return


def _point(point: capacity.CapacityPoint, idle_cpu: float | None = None) -> dict[str, Any]:
    figures = asdict(point)
    del figures["ingest_s"]
    figures["server_cpu_s_per_s_per_session"] = round(point.cpu_per_session, 3)
    if idle_cpu is not None:
        above_idle = (point.server_cpu_s_per_s - idle_cpu) / point.sessions
        figures["server_cpu_s_per_s_per_session_above_idle"] = round(above_idle, 3)
    figures["server_cpu_s_per_s"] = round(point.server_cpu_s_per_s, 3)
    figures["client_cpu_s_per_s"] = round(point.client_cpu_s_per_s, 3)
    return figures


async def _peer(plan: Plan, python: str, cap: dict[str, Any], progress: Callable[[str], None]) -> dict[str, Any]:
    """The same replayed peers against pipecat at each N of `plan.peer_sessions`, beside rtc-omni's
    point of each mode at that N from the sweep (measured here if the sweep stopped before it)."""
    reason = pipecat_peer.unavailable(python)
    if reason is not None:
        return {"skipped": reason}
    points = []
    for n in plan.peer_sessions:
        ours = {name: await _ours_at(plan, cap, name, n, progress) for name in plan.modes}
        progress(f"pipecat: {n} sessions")
        theirs = await pipecat_peer.measure(python, n, plan.capacity_seconds)
        pipecat = theirs["server_cpu_s_per_s_per_session"]
        ratios = {name: round(pipecat / mine, 2) if mine else None for name, mine in ours.items()}
        points.append({**theirs, "rtc_omni_server_cpu_s_per_s_per_session": ours, "ratio": ratios})
    return {"name": "pipecat SmallWebRTCTransport " + pipecat_peer.PIPECAT.split("==")[1], "points": points}


async def _ours_at(plan: Plan, cap: dict[str, Any], name: str, n: int, progress: Callable[[str], None]) -> float:
    """rtc-omni's server CPU-s/s per session of mode `name` at N=`n`: the sweep's, else measured now."""
    point = next((p for p in cap[name] if p["sessions"] == n), None)
    if point is None:
        mode = capacity.MODES[name]
        progress(f"rtc-omni: {n} {mode.noun} sessions, for the comparison")
        with server(sweep_server_args(plan)) as (process, url):
            point = _point(await capacity.session_point(url, process.pid, n, plan.capacity_seconds, mode=mode))
    return float(point["server_cpu_s_per_s_per_session"])
