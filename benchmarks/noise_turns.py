"""What noise suppression (RNNoise, `audio.input.noise_reduction`) does to turn-taking, and what it costs.

All through the one listening path (sessions/listening.py: suppressor -> buffer -> server VAD, its
default settings) on 16 kHz audio, in this process:
  - false turns per minute on noise alone, suppression off and on: speech starts (each would cut
    into an answer) and accepted utterances (each would be committed and answered), for steady
    pink noise and fluctuating pink noise (its loudness changing every 200 ms, as a crowd's does),
    at the level that puts it 10 dB below espeak-ng's speech;
  - speech in that noise: how many utterances each sentence becomes, and the embedded recogniser's
    word error rate (engines/whisper.py) on the clean sentence without and with suppression, on the
    noisy one without suppression (as a manual commit sends it), and on the utterance the server VAD
    committed with suppression on;
  - CPU seconds per audio second of the suppressor (and of its resampling alone) and of the VAD.
Usage: python benchmarks/noise_turns.py [--seconds 60] [--snr-db 10] [--strength 1]
       (needs espeak-ng and the [denoise] and [transcribe] extras)
"""

from __future__ import annotations

import argparse
import asyncio
import time
from collections.abc import Callable

import numpy as np

from rtc_omni.bench.words import SENTENCES, normalised, word_errors
from rtc_omni.client.media import AUDIO_RATE, noise, speech48
from rtc_omni.engines.whisper import WhisperTranscriber
from rtc_omni.media.denoise import NoiseSuppressor
from rtc_omni.media.pcm_resample import PcmStream
from rtc_omni.media.vad import SpeechStarted, SpeechStopped
from rtc_omni.pcm import INPUT_SAMPLE_RATE, float_to_pcm16
from rtc_omni.sessions.idle_prompt import IdleTimeout
from rtc_omni.sessions.inbox import WorkItem
from rtc_omni.sessions.listening import Heard, Listening
from rtc_omni.sessions.turn_taking import TurnTakingEvent, VadSettings

PACKET_BYTES = 640  # 20 ms of 16 kHz PCM16, as the microphone's packets bring it
DECIMATION = AUDIO_RATE // INPUT_SAMPLE_RATE


def to16k(samples48: np.ndarray) -> bytes:
    return float_to_pcm16(samples48[::DECIMATION])


def speech_rms() -> float:
    voiced = np.concatenate([speech48(s) for s in SENTENCES])
    return float(np.sqrt(np.mean(voiced * voiced)))


def listen(pcm16: bytes, strength: float | None) -> tuple[list[TurnTakingEvent | IdleTimeout], list[bytes]]:
    """What the VAD heard, and the utterances a session would commit, for this audio heard 20 ms at a time."""
    heard: list[TurnTakingEvent | IdleTimeout] = []
    utterances: list[bytes] = []

    def queue(work: WorkItem) -> None:
        assert isinstance(work, Heard) and not isinstance(work.event, IdleTimeout)
        heard.append(work.event)
        utterance = listening.utterance(work.event)
        if utterance is not None:
            utterances.append(utterance)

    listening = Listening(queue)
    listening.detect(VadSettings(), echo=None)
    listening.suppress_noise(strength)
    for start in range(0, len(pcm16), PACKET_BYTES):
        listening.hear(pcm16[start : start + PACKET_BYTES])
    return heard, utterances


def false_turns(kind: str, rms: float, seconds: float, strength: float) -> None:
    pcm = to16k(noise(kind, int(seconds * AUDIO_RATE), rms, seed=1))  # type: ignore[arg-type]
    for suppress in (False, True):
        events, _ = listen(pcm, strength if suppress else None)
        starts = sum(isinstance(e, SpeechStarted) for e in events)
        turns = sum(isinstance(e, SpeechStopped) and e.is_speech for e in events)
        print(
            f"  {kind:11} suppression {'on ' if suppress else 'off'}: "
            f"{starts * 60 / seconds:5.1f} speech starts/min, {turns * 60 / seconds:5.1f} turns/min"
        )


def cleaned(pcm16: bytes, strength: float) -> bytes:
    suppressor = NoiseSuppressor(strength)
    return b"".join(suppressor.feed(pcm16[i : i + PACKET_BYTES]) for i in range(0, len(pcm16), PACKET_BYTES))


async def speech_in_noise(rms: float, strength: float) -> None:
    recogniser = WhisperTranscriber()

    async def errors_in(pcm16: bytes, reference: list[str]) -> tuple[int, str]:
        transcript = "".join([delta async for delta in recogniser.transcribe(pcm16)])
        return word_errors(reference, normalised(transcript)), transcript

    errors = {"clean": 0, "clean, suppression on": 0, "noisy, suppression off": 0, "noisy, suppression on": 0}
    words = 0
    utterance_counts = []
    for index, sentence in enumerate(SENTENCES):
        track = np.concatenate([np.zeros(AUDIO_RATE), speech48(sentence), np.zeros(2 * AUDIO_RATE)])
        noisy = to16k(track + noise("fluctuating", track.size, rms, seed=10 + index))
        _, utterances = listen(noisy, strength)
        utterance_counts.append((len(listen(noisy, None)[1]), len(utterances)))
        reference = normalised(sentence)
        words += len(reference)
        clean = to16k(track)
        heard = {"clean": clean, "clean, suppression on": cleaned(clean, strength), "noisy, suppression off": noisy}
        for name, pcm in heard.items():
            errors[name] += (await errors_in(pcm, reference))[0]
        count, transcript = await errors_in(b"".join(utterances), reference)
        errors["noisy, suppression on"] += count
        print(f"  {sentence!r:66} {count} errors, suppressed and committed: {transcript!r}")
    print(f"  utterances each sentence became (suppression off, on): {utterance_counts}")
    for name, count in errors.items():
        print(f"  WER {name:23}: {count / words:.3f} ({count} errors in {words} words)")


def cpu_per_audio_second(work: Callable[[bytes], object], pcm16: bytes) -> float:
    started = time.process_time()
    for start in range(0, len(pcm16), PACKET_BYTES):
        work(pcm16[start : start + PACKET_BYTES])
    return (time.process_time() - started) / (len(pcm16) / 2 / INPUT_SAMPLE_RATE)


def costs(rms: float, seconds: float) -> None:
    pcm = to16k(noise("fluctuating", int(seconds * AUDIO_RATE), rms, seed=2))
    up, down = PcmStream(INPUT_SAMPLE_RATE, 48_000), PcmStream(48_000, INPUT_SAMPLE_RATE)
    listening = Listening(lambda work: None)
    listening.detect(VadSettings(), echo=None)
    print(f"  suppressor       : {cpu_per_audio_second(NoiseSuppressor().feed, pcm):.4f} CPU s per audio s")
    print(f"  its resampling   : {cpu_per_audio_second(lambda p: down.feed(up.feed(p)), pcm):.4f} CPU s per audio s")
    print(f"  listening, no suppression (buffer + VAD): {cpu_per_audio_second(listening.hear, pcm):.4f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=60.0, help="seconds of noise for the turn counts and CPU")
    parser.add_argument("--snr-db", type=float, default=10.0, help="how far the noise stays below the speech")
    parser.add_argument("--strength", type=float, default=1.0, help="noise_reduction.strength, 0 to 1")
    args = parser.parse_args()
    rms = speech_rms() / 10 ** (args.snr_db / 20)
    print(f"noise {args.snr_db:g} dB below espeak-ng's speech (RMS {rms:.4f}); suppression strength {args.strength:g}")
    print(f"false turns on {args.seconds:g} s of noise alone:")
    for kind in ("pink", "fluctuating"):
        false_turns(kind, rms, args.seconds, args.strength)
    print("speech in fluctuating noise (1 s of noise before each sentence, 2 s after):")
    asyncio.run(speech_in_noise(rms, args.strength))
    print("cost, on this machine:")
    costs(rms, args.seconds)


if __name__ == "__main__":
    main()
