"""Benchmark server turn detection and print the figures.

  - VAD CPU: ServerVad.feed on 60 s of speech-and-silence audio, in ms of CPU per second of audio
    (with and without the echo check running against a talker reference);
  - over loopback (server subprocess, espeak-ng sentences spoken into a headless peer's mic):
    speech end -> `response.start` (includes the 500 ms of silence that defines the end), and
    speech start while the talker answers -> talker silent at the peer (barge-in).

Usage: python benchmarks/vad_loopback.py [--trials 8]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import time

import numpy as np

from rtc_omni import patches
from rtc_omni.bench.common import silent_from, start_server, stop, summary
from rtc_omni.client.media import COLOURS, ColourVideoTrack, ScriptedAudioTrack, speech48
from rtc_omni.client.rtc_peers import UnderstandClient
from rtc_omni.media.echo import EchoReference
from rtc_omni.sessions.turn_taking import ServerVad, VadSettings

SENTENCES = ["What colour is this?", "Tell me what you can hear.", "Is anything moving?", "Stop, that is enough."]


def vad_cpu_ms_per_audio_second(with_echo: bool) -> float:
    speech = np.concatenate([np.concatenate([speech48(s)[::3], np.zeros(16_000)]) for s in SENTENCES])
    audio = np.tile(speech, int(np.ceil(60 * 16_000 / speech.size)))[: 60 * 16_000]
    pcm = (audio * 32767).astype("<i2").tobytes()
    echo = EchoReference()
    if with_echo:  # a talker that is always audible makes every speech start run the correlation
        tone = (0.3 * 32767 * np.sin(2 * np.pi * 300 * np.arange(1440) / 24_000)).astype(np.int16)  # a 60 ms packet
        for i in range(100):
            echo.played(tone, position=i * 2880)
    vad = ServerVad(VadSettings(), echo if with_echo else None)
    started = time.process_time()
    for offset in range(0, len(pcm), 640):
        if with_echo and offset % 64_000 == 0:
            for i in range(100):  # keep the reference fresh
                echo.played(tone, position=(offset // 640 + i) * 2880)
        vad.feed(pcm[offset : offset + 640])
    return (time.process_time() - started) * 1000 / 60


async def bench_loopback(trials: int) -> tuple[list[float], list[float]]:
    process, url = start_server(["--synthetic-voice", "tone"])
    ends, barge = [], []
    try:
        for i in range(trials):
            mic = ScriptedAudioTrack()
            client = UnderstandClient(url, video=ColourVideoTrack(COLOURS["red"], 160, 120, 15), audio=mic)
            await client.connect()
            await client.configure(turn_detection={"type": "server_vad"})
            await client.wait_event("video.frame.ack")
            mic.say(speech48(SENTENCES[i % len(SENTENCES)]))
            start = await client.wait_event("response.start", timeout=30)
            ends.append(client.event_times[client.events.index(start)] - mic.clip_ended_at[-1])
            async with asyncio.timeout(20):
                while client.recorder.voiced_frames(since=time.monotonic() - 0.1) < 3:
                    await asyncio.sleep(0.01)
            await asyncio.sleep(1.0)  # past the first short chunk: the talker now speaks without gaps
            mark = len(client.events)
            mic.say(speech48("Wait."))
            await client.wait_event("response.cancelled", after=mark, timeout=10)
            await asyncio.sleep(0.5)
            # 200 ms of silence: longer than any pause between the talker's words
            quiet = silent_from(client.recorder, mic.clip_started_at[-1], run=10)
            if quiet is not None:
                barge.append(quiet - mic.clip_started_at[-1])
            await client.close()
    finally:
        stop(process)
    return ends, barge


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--trials", type=int, default=8)
    args = parser.parse_args()
    patches.apply()  # the headless peers gather on 127.0.0.1 only
    print(f"machine: {os.cpu_count()} cores, Python {sys.version.split()[0]}")
    print(
        f"VAD CPU: {vad_cpu_ms_per_audio_second(False):.2f} ms per second of audio; "
        f"with the echo check against an audible talker {vad_cpu_ms_per_audio_second(True):.2f} ms"
    )
    ends, barge = await bench_loopback(args.trials)
    print(f"speech end -> response.start:        {summary(ends)}  (includes the 500 ms silence_duration_ms)")
    print(f"speech start -> talker silent (peer): {summary(barge)}")


if __name__ == "__main__":
    asyncio.run(main())
