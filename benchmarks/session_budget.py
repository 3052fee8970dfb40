"""What each part of an understanding session costs the server: the capacity load with one part off.

The capacity sweep's load (`rtc_omni.bench.capacity.session_point`: N replayed peers, camera +
mic + talker, a turn every 5 s) against a fresh `rtc-omni serve` per round, in one of these forms:

- `all`: the server as it is;
- `no-decode`: each camera's first frame is decoded, then handed on again for every later frame
  (new timestamps) without decoding: sampling, JPEG and turns go on as before;
- `no-mic`: each microphone's first packet is decoded, then its audio handed on again for every
  later packet without decoding: ingest and the answer (which names the tone it heard) go on as
  before;
- `no-talker`: the engine's speech is dropped before the talker: nothing is encoded or sent;
- `no-codecs`: the three above together: no codec runs past each stream's first frame, the rest of
  the session goes on;
- `no-codecs-no-answer`: and the synthetic engine answers each turn with one word and no speech,
  so the stand-in model's own work (analysing the frames, writing and voicing ~40 words) and the
  answer's ~40 text deltas are gone too;
- `transport`: no codec runs and no frame or audio is handed on (aiortc still receives, decrypts,
  parses and reassembles every packet; turns fail for want of frames): aiortc's transport alone.

The forms alternate within each round, so the machine's drift falls on all of them alike. What a
part costs is `all` minus the form without it; the parts of one form are not always the sum of the
single ones (threads and wake-ups are shared). Each form is the server with one private function
replaced (the `FORMS` below), for measuring only.
Figures: docs/benchmarks.md, "What a session's CPU is made of, part by part".
Run inside the loopback namespace: python -m benchmarks.session_budget [N] [SECONDS] [ROUNDS]
"""

from __future__ import annotations

import asyncio
import statistics
import subprocess
import sys

from rtc_omni import patches
from rtc_omni.bench.capacity import session_point
from rtc_omni.bench.common import free_port, stop, wait_healthy

NO_DECODE = """
from rtc_omni.patches import decoding
from aiortc.codecs import get_decoder
def decoder_worker(loop, input_q, output_q, decode_error):
    decoded = None
    while (task := input_q.get()) is not None:
        codec, encoded_frame = task
        if decoded is None:
            frames = get_decoder(codec).decode(encoded_frame)
            decoded = frames[0] if frames else None
        if decoded is not None:
            decoded.pts = encoded_frame.timestamp
            decoding._hand_over(loop, output_q, [decoded])
    decoding._hand_over(loop, output_q, [None])
decoding.decoder_worker = decoder_worker
"""
NO_MIC = """
from rtc_omni.patches import decoding
decode = decoding.MicDecoder._decode
def decode_once(self, codec, encoded_frame):
    if not hasattr(self, "first"):
        self.first = decode(self, codec, encoded_frame)
    return self.first
decoding.MicDecoder._decode = decode_once
"""
NO_TALKER = """
from rtc_omni.media import talker
async def write(self, samples): return None
talker.TalkerAudioTrack.write = write
"""
NO_ANSWER = """
from rtc_omni.engines import synthetic
from rtc_omni.engines.engine import TextDelta
async def generate(self, turn):
    yield TextDelta("ok")
synthetic.SyntheticEngine.generate = generate
"""
DROP_VIDEO = """
from rtc_omni.patches import decoding
def decoder_worker(loop, input_q, output_q, decode_error):
    while input_q.get() is not None:
        pass
    decoding._hand_over(loop, output_q, [None])
decoding.decoder_worker = decoder_worker
"""
DROP_MIC = """
from rtc_omni.patches import decoding
put = decoding.MicDecoder.put
decoding.MicDecoder.put = lambda self, task: put(self, task) if task is None else None
"""
NO_CODECS = NO_DECODE + NO_MIC + NO_TALKER
FORMS = {
    "all": "",
    "no-decode": NO_DECODE,
    "no-mic": NO_MIC,
    "no-talker": NO_TALKER,
    "no-codecs": NO_CODECS,
    "no-codecs-no-answer": NO_CODECS + NO_ANSWER,
    "transport": DROP_VIDEO + DROP_MIC + NO_TALKER,
}
SERVE = "import sys; from rtc_omni.cli import main; sys.exit(main())"


async def run_form(form: str, sessions: int, seconds: float) -> float:
    """Per-session server CPU-s/s of one fresh server in `form` under the capacity load."""
    port = free_port()
    command = [sys.executable, "-c", FORMS[form] + "\n" + SERVE, "serve", "--host", "127.0.0.1", "--port", str(port)]
    command += ["--synthetic-voice", "tone", "--log-level", "warning", "--max-sessions", str(sessions + 1)]
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(url + "/healthz", process)
        point = await session_point(url, process.pid, sessions, seconds)
    finally:
        stop(process)
    return point.cpu_per_session


async def main(sessions: int, seconds: float, rounds: int) -> None:
    patches.apply()
    results: dict[str, list[float]] = {form: [] for form in FORMS}
    for round_ in range(rounds):
        for form in FORMS:
            results[form].append(await run_form(form, sessions, seconds))
            print(f"round {round_ + 1} {form:19} {results[form][-1]:.4f} CPU-s/s per session", flush=True)
    whole = statistics.mean(results["all"])
    print(f"N={sessions}, {seconds:.0f} s, {rounds} rounds; means:")
    for form, values in results.items():
        part = "" if form == "all" else f"  -> the part costs {whole - statistics.mean(values):.4f}"
        print(f"  {form:19} {statistics.mean(values):.4f}{part}")


if __name__ == "__main__":
    n, secs, rounds = (sys.argv[1:] + ["8", "15", "3"][len(sys.argv) - 1 :])[:3]
    asyncio.run(main(int(n), float(secs), int(rounds)))
