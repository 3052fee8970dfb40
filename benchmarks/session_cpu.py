"""Server CPU of one understanding session, idle and with spoken turns, and print the figures.

One headless peer (a 640x480@30 VP8 camera, a 440 Hz Opus mic, receiving the talker) connects to
`rtc-omni serve` (synthetic engine, tone voice, default `sample_fps` 2). After a warm-up the
server's CPU (utime + stime from /proc/PID/stat) is read over two phases:
  - idle: the session runs, nobody asks anything;
  - turns: a `video.query` every `--turn-every` seconds, each answer spoken by the talker (an
    answer plays for longer than that, so the next query waits for its end: the phase lasts until
    the last answer ends, and the talker speaks most of it).
Each run starts a fresh server; the figures are CPU-seconds per wall second, one line per run,
then the median of the runs. The peer runs in this process, so its own (large) CPU is not counted.

Usage: python benchmarks/session_cpu.py [--runs 3] [--idle 30] [--turns 30] [--turn-every 5]
Run it inside the loopback-only network namespace. Compare trees by PYTHONPATH: the server
subprocess imports `rtc_omni` from the same path as this script.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time
import urllib.request

from rtc_omni import patches
from rtc_omni.bench.common import CpuMeter, server
from rtc_omni.client.media import COLOURS, ColourVideoTrack, ToneAudioTrack
from rtc_omni.client.rtc_peers import UnderstandClient

WARM_UP_S = 5.0


def session_stats(client: UnderstandClient) -> dict[str, object]:
    url = f"{client.server}/v1/rtc/sessions/{client.session_id}"
    with urllib.request.urlopen(urllib.request.Request(url, headers=client.session_headers), timeout=10) as response:
        stats: dict[str, object] = json.loads(response.read())
    return stats


async def one_run(idle_s: float, turns_s: float, turn_every_s: float) -> tuple[float, float, float, float, int]:
    """Idle CPU-s/s, turns CPU-s/s, the turns phase's length and seconds of speech heard in it, and
    the talker's packets sent."""
    with server() as (process, url):
        video = ColourVideoTrack(COLOURS["red"], 640, 480, 30)
        client = UnderstandClient(url, video=video, audio=ToneAudioTrack())
        await client.connect()
        try:
            await client.configure()
            await asyncio.sleep(WARM_UP_S)
            meter = CpuMeter([process.pid])
            await asyncio.sleep(idle_s)
            idle = meter.per_second()[0]

            meter = CpuMeter([process.pid])
            speech_s = 0.0
            started = time.monotonic()
            next_turn = started
            while next_turn < started + turns_s:
                await asyncio.sleep(max(0.0, next_turn - time.monotonic()))
                result = await client.ask("What colour is this?", timeout=turn_every_s * 4)
                if result.done_at is not None and client.recorder is not None:
                    speech_s += client.recorder.voiced_frames(result.sent_at, result.done_at) * 0.02
                next_turn += turn_every_s
            await asyncio.sleep(max(0.0, started + turns_s - time.monotonic()))
            turns = meter.per_second()[0]
            phase_s = time.monotonic() - started
            stats = session_stats(client)
            sent = int(stats.get("talker_packets_sent", stats.get("talker_frames_sent", 0)))  # type: ignore[call-overload]
        finally:
            await client.close()
    return idle, turns, phase_s, speech_s, sent


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--idle", type=float, default=30.0, help="seconds of the idle phase")
    parser.add_argument("--turns", type=float, default=30.0, help="seconds of the phase with turns")
    parser.add_argument("--turn-every", type=float, default=5.0)
    args = parser.parse_args()
    patches.apply()
    idles, turns = [], []
    for run in range(args.runs):
        idle, turn, phase_s, speech_s, sent = await one_run(args.idle, args.turns, args.turn_every)
        idles.append(idle)
        turns.append(turn)
        print(
            f"run {run + 1}: idle {idle:.4f} CPU-s/s, turns {turn:.4f} CPU-s/s "
            f"(speech heard {speech_s:.1f} s of {phase_s:.1f} s; {sent} talker packets sent in all)",
            flush=True,
        )
    idle, turn = statistics.median(idles), statistics.median(turns)
    print(f"median of {args.runs}: idle {idle:.4f} CPU-s/s, turns {turn:.4f} CPU-s/s")


if __name__ == "__main__":
    asyncio.run(main())
