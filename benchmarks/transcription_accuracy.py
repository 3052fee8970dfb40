"""How well, and at what CPU cost, the embedded recogniser (engines/whisper.py) hears espeak-ng speech.

Each sentence is spoken by espeak-ng as the synthetic engine speaks (170 words per minute, 24 kHz),
resampled to the 16 kHz a committed audio item holds (PyAV), and transcribed by
`WhisperTranscriber`. Prints each transcript, the word error rate (words compared lower-case,
without punctuation, British and American spellings as one) and the recogniser's CPU seconds per
second of audio (process CPU time, model loading excluded).
Usage: python benchmarks/transcription_accuracy.py   (needs espeak-ng and the [transcribe] extra)
"""

from __future__ import annotations

import asyncio
import time

from rtc_omni.bench.words import SENTENCES, normalised, word_errors
from rtc_omni.engines.synthetic import espeak_voice
from rtc_omni.engines.whisper import WhisperTranscriber
from rtc_omni.media.pcm_resample import convert
from rtc_omni.pcm import INPUT_SAMPLE_RATE


def spoken16k(text: str) -> bytes:
    speech = espeak_voice(text)
    pcm24 = (speech.clip(-1, 1) * 32767).astype("<i2").tobytes()
    return convert(pcm24, 24_000, INPUT_SAMPLE_RATE)


async def main() -> None:
    recogniser = WhisperTranscriber()
    audio = [spoken16k(sentence) for sentence in SENTENCES]
    await anext(recogniser.transcribe(audio[0]))  # load the model outside the measurement
    errors = words = 0
    audio_s = sum(len(pcm) / 2 / INPUT_SAMPLE_RATE for pcm in audio)
    cpu_start = time.process_time()
    for sentence, pcm in zip(SENTENCES, audio):
        transcript = "".join([delta async for delta in recogniser.transcribe(pcm)])
        reference = normalised(sentence)
        errors += word_errors(reference, normalised(transcript))
        words += len(reference)
        print(f"{sentence!r:70} -> {transcript!r}")
    cpu_s = time.process_time() - cpu_start
    print(f"WER {errors / words:.3f} ({errors} errors in {words} words)")
    print(f"CPU {cpu_s / audio_s:.2f} s per audio second ({cpu_s:.1f} s for {audio_s:.1f} s of speech)")


if __name__ == "__main__":
    asyncio.run(main())
