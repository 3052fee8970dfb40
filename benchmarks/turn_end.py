"""Benchmark semantic turn detection against silence alone, and print the figures.

  - the end-of-turn model's CPU per inference on 8 s of audio (features, ONNX run; one thread);
  - CPU per second of audio: the VAD alone, and with one inference at each of its pauses, over 60 s of
    espeak-ng sentences with 1 s pauses;
  - over loopback (server subprocess, espeak-ng speech spoken in real time into a headless peer's
    mic): speech end -> `response.start` for complete and incomplete utterances, `server_vad`
    (500 ms of silence) against `semantic_vad` at eagerness medium and high.

Usage: python benchmarks/turn_end.py [--trials 3]   (needs the [turn] extra and espeak-ng)
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from rtc_omni import patches
from rtc_omni.bench.common import start_server, stop, summary
from rtc_omni.client.media import COLOURS, ColourVideoTrack, ScriptedAudioTrack, speech48
from rtc_omni.client.rtc_peers import UnderstandClient
from rtc_omni.engines import smart_turn
from rtc_omni.media.log_mel import log_mel
from rtc_omni.media.vad import SpeechStopped
from rtc_omni.pcm import float_to_pcm16, pcm16_to_float
from rtc_omni.sessions.turn_taking import Semantic, ServerVad, VadSettings

# The model judges these clearly on espeak-ng speech (it misjudges many unfinished robotic phrases:
# docs/turn-taking.md), so the figures show the decision, not the model's errors.
COMPLETE = ["What is the weather like in Paris today?", "Where is the nearest station?", "How are you doing today?"]
INCOMPLETE = ["What is the weather like in"]
MODES: dict[str, dict[str, Any]] = {
    "server_vad": {"type": "server_vad"},
    "semantic_vad medium": {"type": "semantic_vad", "eagerness": "medium"},
    "semantic_vad high": {"type": "semantic_vad", "eagerness": "high"},
}
CPU_RUNS = 30


def cpu_ms(run: Callable[[], object], runs: int = CPU_RUNS) -> float:
    """CPU milliseconds per call (all threads of the process)."""
    run()  # warm
    started = time.process_time()
    for _ in range(runs):
        run()
    return (time.process_time() - started) * 1000 / runs


def conversation16k(seconds: int = 60) -> bytes:
    """espeak-ng sentences with 1 s pauses, repeated to `seconds`, as 16 kHz PCM16."""
    once = np.concatenate([np.concatenate([speech48(s)[::3], np.zeros(16_000)]) for s in COMPLETE + INCOMPLETE])
    return float_to_pcm16(np.tile(once, int(np.ceil(seconds * 16_000 / once.size)))[: seconds * 16_000])


def vad_pass(pcm: bytes, settings: VadSettings) -> tuple[float, int]:
    """CPU ms per audio second of the VAD, and the pauses it heard (one inference each)."""
    vad = ServerVad(settings, None)
    pauses = 0
    started = time.process_time()
    for offset in range(0, len(pcm), 640):
        pauses += sum(isinstance(e, SpeechStopped) and e.is_speech for e in vad.feed(pcm[offset : offset + 640]))
    return (time.process_time() - started) * 1000 / (len(pcm) / 32_000), pauses


def print_cpu() -> None:
    window = pcm16_to_float(conversation16k(smart_turn.WINDOW_S))
    pcm8 = float_to_pcm16(window)
    features_ms = cpu_ms(lambda: log_mel(window, smart_turn.WINDOW_S))
    total_ms = cpu_ms(lambda: smart_turn.complete_probability(pcm8))
    print(
        f"end-of-turn model, CPU per inference on 8 s: {total_ms:.1f} ms "
        f"(features {features_ms:.1f} ms, ONNX run {total_ms - features_ms:.1f} ms)"
    )
    pcm = conversation16k()
    seconds = len(pcm) / 32_000
    vad_ms, _ = vad_pass(pcm, VadSettings())
    print(f"CPU per second of audio: server_vad {vad_ms:.2f} ms")
    for eagerness in ("medium", "high"):
        semantic_vad_ms, pauses = vad_pass(pcm, VadSettings(semantic=Semantic(eagerness)))
        per_s = semantic_vad_ms + pauses / seconds * total_ms
        print(
            f"                         semantic_vad {eagerness}: {per_s:.2f} ms "
            f"(VAD {semantic_vad_ms:.2f} ms + {pauses / seconds:.2f} inferences/s)"
        )


async def speech_end_to_response(url: str, detection: dict[str, Any], text: str) -> float | None:
    """One fresh session: `text` spoken, then silence; seconds from its end to `response.start`."""
    mic = ScriptedAudioTrack()
    client = UnderstandClient(url, video=ColourVideoTrack(COLOURS["red"], 160, 120, 15), audio=mic)
    try:
        await client.connect()
        await client.configure(turn_detection=detection, modalities=["text"])
        await client.wait_event("video.frame.ack")
        mic.say(speech48(text))
        start = await client.wait_event("response.start", timeout=30)
        return client.event_times[client.events.index(start)] - mic.clip_ended_at[-1]
    except TimeoutError:
        return None
    finally:
        await client.close()


async def print_loopback(trials: int) -> None:
    process, url = start_server()
    try:
        for mode, detection in MODES.items():
            for kind, texts in (("complete", COMPLETE), ("incomplete", INCOMPLETE)):
                ends = []
                for _ in range(trials):
                    for text in texts:
                        end = await speech_end_to_response(url, detection, text)
                        if end is not None:
                            ends.append(end)
                print(f"speech end -> response.start, {mode:20} {kind:10}: {summary(ends)}")
    finally:
        stop(process)


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--trials", type=int, default=3, help="rounds over the utterances, per mode")
    args = parser.parse_args()
    if (reason := smart_turn.unavailable()) is not None:
        sys.exit(reason)
    patches.apply()  # the headless peers gather on 127.0.0.1 only
    print(f"machine: {os.cpu_count()} cores, Python {sys.version.split()[0]}")
    print_cpu()
    await print_loopback(args.trials)


if __name__ == "__main__":
    asyncio.run(main())
