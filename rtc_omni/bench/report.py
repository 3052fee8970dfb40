"""The benchmark's outputs: a table on stdout, a JSON file, PNG plots."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from .capacity import MODES
from .run import Result


def _ms(stats: dict[str, float]) -> str:
    if not stats.get("n"):
        return "no samples"
    return f"p50 {stats['p50']:.1f} / p95 {stats['p95']:.1f} / p99 {stats['p99']:.1f} ms (n={stats['n']})"


def rows(result: Result) -> list[tuple[str, str]]:
    """(figure, value) pairs in the order of the issue's items; items the plan skipped are absent."""
    fig = result.figures
    out: list[tuple[str, str]] = []
    for codec, ingest in fig.get("ingest", {}).items():
        out.append((f"1 ingest: RTP frame -> video.frame.ack, 640x480@30 {codec}", _ms(ingest["frame_to_ack_ms"])))
    for name, stats in fig.get("engine_to_wire", {}).items():
        out.append((f"2 engine to wire: {name.removesuffix('_ms').replace('_', ' ')}", _ms(stats)))
    if "interrupt_to_silence_ms" in fig:
        out.append(("3 interrupt: video.query -> talker silent at peer", _ms(fig["interrupt_to_silence_ms"])))
    out.extend(_capacity_rows(fig["capacity"]))
    if "connect" in fig:
        out.append(("5 connect: offer -> connected", _ms(fig["connect"]["offer_to_connected_ms"])))
        out.append(("5 connect: offer -> first ack", _ms(fig["connect"]["offer_to_first_ack_ms"])))
    if "websocket" in fig:
        out.extend(_websocket_rows(fig["websocket"], fig["ingest"]["vp8"]))
    if "peer" in fig:
        out.extend(_peer_rows(fig["peer"]))
    for codec, stream in fig.get("generate", {}).items():
        out.append(
            (
                f"generate {codec}: frames, rate, jitter p95, CPU per generated s",
                f"{stream['frames_received']}/{stream['frames_sent']} ({stream['missing']} missing), "
                f"{stream['fps']:.2f} fps, {stream['jitter_p95_ms']:.1f} ms, {stream['cpu_per_generated_second']:.3f}",
            )
        )
    return out


def _capacity_rows(cap: dict[str, Any]) -> list[tuple[str, str]]:
    """Each N's points of every mode side by side, then each mode's largest N passing."""
    server = " ".join(cap.get("server_args", [])) or "default"
    out = [(f"4 capacity: idle server ({server} arguments)", f"{cap['idle_server_cpu_s_per_s']:.3f} CPU-s/s")]
    modes = cap["modes"]
    points = sorted((p["sessions"], index, mode, p) for index, mode in enumerate(modes) for p in cap[mode])
    for n, _, mode, point in points:
        out.append((f"4 capacity: {n} {MODES[mode].noun} sessions (replayed peers)", _capacity_row(point)))
    for mode in modes:
        largest = str(cap[f"max_{mode}"])
        if cap[mode] and cap[f"max_{mode}"] == cap[mode][-1]["sessions"]:
            largest += " (every N swept passed: the limit is higher)"
        out.append((f"4 capacity: largest N {MODES[mode].noun} sessions passing", largest))
    for point in cap["generate"]:
        out.append((f"4 capacity: {point['sessions']} generation streams 832x480@16", _capacity_row(point)))
    if cap["generate"]:
        out.append(("4 capacity: largest N generation streams passing", str(cap["max_generate"])))
    return out


def _capacity_row(point: dict[str, Any]) -> str:
    text = f"server {point['server_cpu_s_per_s_per_session']:.3f} CPU-s/s per session"
    if "server_cpu_s_per_s_per_session_above_idle" in point:
        text += f" ({point['server_cpu_s_per_s_per_session_above_idle']:.3f} above idle)"
    if point["ingest_p95_ms"] is not None:
        text += f", ingest p50 {point['ingest_p50_ms']:.1f} / p95 {point['ingest_p95_ms']:.1f} ms"
    if point["turns_sent"]:
        text += f", turns {point['turns_completed']}/{point['turns_sent']}"
    if point["min_fps"] is not None:
        text += f", min {point['min_fps']:.2f} fps, {point['frames_missing']} frames missing"
    return text + f" (client {point['client_cpu_s_per_s']:.2f} CPU-s/s) {'ok' if point['ok'] else 'FAIL'}"


def _websocket_rows(ws: dict[str, Any], webrtc: dict[str, Any]) -> list[tuple[str, str]]:
    return [
        ("6a WebSocket: video.frame -> ack (JPEG @10 fps)", _ms(ws["frame_to_ack_ms"])),
        (
            "6a payload bytes/s: WebSocket vs WebRTC VP8+Opus",
            f"{ws['payload_bytes_per_s'] / 1000:.0f} kB/s vs {webrtc['payload_bytes_per_s'] / 1000:.0f} kB/s "
            f"(x{ws['bytes_ratio_ws_to_webrtc']})",
        ),
        (
            "6a ack latency ratio WebSocket / WebRTC",
            f"p50 x{ws['ack_p50_ratio_ws_to_webrtc']}, p95 x{ws['ack_p95_ratio_ws_to_webrtc']}",
        ),
    ]


def _peer_rows(peer: dict[str, Any]) -> list[tuple[str, str]]:
    if "skipped" in peer:
        return [("6b peer server", f"not measured: {peer['skipped']}")]
    return [
        (
            f"6b {peer['name']}, {p['sessions']} replayed sessions: server CPU-s/s per session",
            f"{p['server_cpu_s_per_s_per_session']:.3f} vs rtc-omni {_ours(p)}"
            f" (echo heard by {p['echo_heard']}/{p['sessions']}; {p.get('event_loop', 'asyncio')})",
        )
        for p in peer["points"]
    ]


def _ours(point: dict[str, Any]) -> str:
    """rtc-omni's figure of each mode at the point's N, and pipecat's as a multiple of it."""
    ours = point["rtc_omni_server_cpu_s_per_s_per_session"]
    return ", ".join(f"{MODES[mode].noun} {cpu:.3f} (x{point['ratio'][mode]})" for mode, cpu in ours.items())


def table(result: Result) -> str:
    m = result.machine
    head = (
        f"rtc-omni bench: {m['cores']} cores ({m['cpu']}), Python {m['python']}, aiortc {m['aiortc']}, "
        f"load average at start {m['load_average_at_start'][0]:.2f}"
    )
    lines = rows(result)
    width = max(len(name) for name, _ in lines)
    return "\n".join([head, *(f"{name:<{width}}  {value}" for name, value in lines)])


def write_json(result: Result, path: Path) -> None:
    path.write_text(json.dumps({"machine": result.machine, **result.figures, "samples_s": result.samples}, indent=1))


def write_plots(result: Result, folder: Path) -> list[Path]:
    """latency.png (distributions) and capacity.png (server CPU vs sessions)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    folder.mkdir(parents=True, exist_ok=True)
    series = {name: values for name, values in result.samples.items() if values}
    fig, ax = plt.subplots(figsize=(9, 0.45 * len(series) + 1.5))
    ax.boxplot([[v * 1000 for v in values] for values in series.values()], vert=False, whis=(1, 99), sym=".")
    ax.set_yticks(range(1, len(series) + 1), list(series))
    ax.set_xscale("log")
    ax.set_xlabel("ms (box: p25-p75, whiskers: p1-p99)")
    ax.set_title("rtc-omni bench: latency distributions over 127.0.0.1")
    fig.tight_layout()
    latency = folder / "latency.png"
    fig.savefig(latency, dpi=110)
    plt.close(fig)

    cap = result.figures["capacity"]
    fig, ax = plt.subplots(figsize=(7, 4))
    for kind in (*cap["modes"], "generate"):
        points = cap[kind]
        ax.plot(
            [p["sessions"] for p in points], [p["server_cpu_s_per_s"] for p in points], "o-", label=f"{kind}: server"
        )
        ax.plot(
            [p["sessions"] for p in points],
            [p["client_cpu_s_per_s"] for p in points],
            "x--",
            label=f"{kind}: bench peers",
        )
    ax.axhline(result.machine["cores"], color="grey", linewidth=0.8, label="all cores")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlabel("concurrent sessions")
    ax.set_ylabel("CPU-seconds per second")
    ax.set_title("CPU vs sessions (peers run on the same cores)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    capacity = folder / "capacity.png"
    fig.savefig(capacity, dpi=110)
    plt.close(fig)
    return [latency, capacity]
