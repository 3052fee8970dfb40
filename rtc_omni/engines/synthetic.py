"""The embedded CPU engine: answers honestly about the media it was given.

It measures the frames (count, size, the newest frame's mean colour and its name, motion) and the
audio (duration, dominant frequency), writes that up as its answer, streams the words at a token
rate after a time-to-first-token, and speaks the answer in chunks shaped like vLLM-Omni's talker
output (a short first chunk, then longer ones). Tests and benchmarks use it to prove the media path.

It calls tools by a documented, deterministic rule (`chosen_call`), so that every event of a
function call can be tested: it calls the first offered tool whose name is in the user's text,
with the first JSON object in that text as the arguments, and after a tool's output it says what
the tool returned.
"""

from __future__ import annotations

import asyncio
import io
import json
import math
import shutil
import subprocess
import uuid
import wave
import zlib
from collections import deque
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import av
import numpy as np

from ..pcm import INPUT_SAMPLE_RATE, TALKER_SAMPLE_RATE, pcm16_to_float
from .engine import (
    AudioChunk,
    ForcedTool,
    FunctionArguments,
    FunctionCallStarted,
    FunctionTool,
    TextDelta,
    Transcriber,
    TurnFrame,
    UnderstandOutput,
    UnderstandTurn,
    Usage,
)

FIRST_AUDIO_CHUNK_S = 0.32  # Qwen3-Omni: ~4 codec frames before the first audio output
AUDIO_CHUNK_S = 2.0  # then ~25 codec frames per output
_FFT_WINDOW_S = 10.0
# How the engine counts tokens, at the rates of the Qwen-Omni models it stands in for.
AUDIO_IN_TOKEN_MS = 40.0  # the audio encoder: 25 tokens per second of input audio
AUDIO_OUT_TOKEN_MS = 80.0  # the talker's codec: 12.5 frames per second of speech
IMAGE_PATCH_PX = 28  # the vision encoder: one token per 28x28 patch
MOTION_SIDE = 64  # motion is measured on 64x64 grey previews
COLOUR_SIDE = 8  # the colour is named from the smallest preview JPEG decodes (1/8 scale)

_PALETTE: dict[str, tuple[int, int, int]] = {
    "black": (0, 0, 0),
    "white": (255, 255, 255),
    "grey": (128, 128, 128),
    "red": (255, 0, 0),
    "green": (0, 255, 0),
    "blue": (0, 0, 255),
    "yellow": (255, 255, 0),
    "cyan": (0, 255, 255),
    "magenta": (255, 0, 255),
    "orange": (255, 140, 0),
    "purple": (128, 0, 128),
    "dark green": (0, 110, 0),
    "navy": (0, 0, 128),
    "brown": (140, 80, 20),
}


def colour_name(rgb: tuple[float, float, float]) -> str:
    """The palette colour nearest to an RGB mean."""
    target = np.asarray(rgb, dtype=np.float32)
    return min(_PALETTE, key=lambda name: float(np.sum((np.asarray(_PALETTE[name]) - target) ** 2)))


def motion_score(frames: list[TurnFrame]) -> float:
    """Mean absolute difference between consecutive frames (64x64 grey), 0 = still, 1 = maximal."""
    if len(frames) < 2:
        return 0.0
    from PIL import Image

    small = [
        np.asarray(Image.fromarray(f.preview("L", MOTION_SIDE)).resize((MOTION_SIDE, MOTION_SIDE)), dtype=np.float32)
        for f in frames
    ]
    diffs = [float(np.mean(np.abs(a - b))) for a, b in zip(small, small[1:])]
    return float(np.mean(diffs)) / 255.0


def dominant_frequency(pcm16: bytes, sample_rate: int) -> float | None:
    """The strongest frequency in the last few seconds of audio, or None for silence."""
    samples = pcm16_to_float(pcm16)
    samples = samples[-int(_FFT_WINDOW_S * sample_rate) :]
    if samples.size < sample_rate // 20 or float(np.sqrt(np.mean(samples**2))) < 0.005:
        return None
    spectrum = np.abs(np.fft.rfft(samples * np.hanning(samples.size)))
    spectrum[0] = 0.0
    return float(np.argmax(spectrum) * sample_rate / samples.size)


@dataclass(frozen=True)
class TurnAnalysis:
    frame_count: int
    width: int
    height: int
    mean_rgb: tuple[int, int, int]
    colour: str
    motion: float
    audio_seconds: float
    audio_hz: float | None
    query: str
    speech_ms: float | None = None
    history_items: int = 0

    def describe(self) -> str:
        r, g, b = self.mean_rgb
        if self.frame_count == 0:
            parts = ["I see no image."]
        else:
            parts = [
                f"I see {self.frame_count} frame{'s' if self.frame_count != 1 else ''} of {self.width}x{self.height}.",
                f"The newest frame is mostly {self.colour}, mean colour RGB({r}, {g}, {b}).",
                f"Motion across the frames is {self.motion:.3f}.",
            ]
        if self.audio_seconds == 0:
            parts.append("I heard no audio.")
        elif self.audio_hz is None:
            parts.append(f"I heard {self.audio_seconds:.2f} seconds of silence.")
        else:
            parts.append(
                f"I heard {self.audio_seconds:.2f} seconds of audio, dominant frequency about {self.audio_hz:.0f} Hz."
            )
        if self.speech_ms is not None:
            parts.append(f"The speech segment lasted {self.speech_ms / 1000:.2f} seconds.")
        parts.append(f'You asked: "{self.query}".' if self.query else "You asked nothing in text.")
        if self.history_items:
            parts.append(f"I was given {self.history_items} earlier conversation items.")
        return " ".join(parts)


def analyse(turn: UnderstandTurn) -> TurnAnalysis:
    """What the answer says; a turn without frames (a realtime text conversation) sees no image."""
    newest = turn.frames[-1] if turn.frames else None
    # The mean colour of a 1/8-scale decode: JPEG's DC terms are the mean of each 8x8 block.
    preview = newest.preview("RGB", COLOUR_SIDE) if newest is not None else np.zeros((0, 0, 3), dtype=np.uint8)
    mean = preview.reshape(-1, 3).mean(axis=0) if preview.size else np.zeros(3)
    mean_rgb = (int(round(mean[0])), int(round(mean[1])), int(round(mean[2])))
    width, height = newest.size if newest is not None else (0, 0)
    return TurnAnalysis(
        frame_count=len(turn.frames),
        width=width,
        height=height,
        mean_rgb=mean_rgb,
        colour=colour_name(mean_rgb),
        motion=motion_score(turn.frames),
        audio_seconds=len(turn.audio_pcm16) / 2 / INPUT_SAMPLE_RATE,
        audio_hz=dominant_frequency(turn.audio_pcm16, INPUT_SAMPLE_RATE),
        query=turn.query,
        speech_ms=turn.speech_ms,
        history_items=len(turn.history),
    )


ARGUMENT_DELTA_CHARS = 8  # a call's arguments stream in pieces of this many characters, one per token


def first_json_object(text: str) -> dict[str, Any] | None:
    """The first JSON object written in `text`, or None."""
    decoder = json.JSONDecoder()
    start = text.find("{")
    while start != -1:
        try:
            value, _ = decoder.raw_decode(text, start)
        except ValueError:
            value = None
        if isinstance(value, dict):
            return value
        start = text.find("{", start + 1)
    return None


def chosen_call(turn: UnderstandTurn) -> tuple[FunctionTool, str] | None:
    """The synthetic engine's rule for calling a tool, and the arguments (JSON) it calls it with.

    With `tool_choice` auto: the first of the turn's tools whose name appears in the user's text;
    `required`: that tool, or else the first tool; a named choice: that tool; `none`: no call.
    The arguments are the first JSON object in the text, or `{}`.
    """
    choice = turn.tool_choice
    if not turn.tools or choice == "none":
        return None
    named = [tool for tool in turn.tools if tool.name in turn.query]
    if isinstance(choice, ForcedTool):
        named = [tool for tool in turn.tools if tool.name == choice.name]
    elif choice == "required":
        named = named or list(turn.tools)
    if not named:
        return None
    return named[0], json.dumps(first_json_object(turn.query) or {})


def tool_report(turn: UnderstandTurn) -> str | None:
    """How an answer starts when a tool's output is the last thing before the user's input, if any:
    "The tool get_weather returned 22C."."""
    if not turn.history or turn.history[-1].get("role") != "tool":
        return None
    result = turn.history[-1]
    names = {call["id"]: call["function"]["name"] for past in turn.history for call in past.get("tool_calls", [])}
    name = names.get(result.get("tool_call_id"), "tool")
    return f"The tool {name} returned {result.get('content', '')}."


def count_usage(turn: UnderstandTurn, answer_words: int, speech_samples: int) -> Usage:
    """The turn's tokens, counted honestly from what the engine took and gave: a word of text is a
    token (the answer streams one word per token), audio and images at the rates above."""
    text_in = sum(len(text.split()) for text in (turn.system_prompt or "", turn.query))
    text_in += sum(len(str(past.get("content", "")).split()) for past in turn.history)
    audio_in = math.ceil(len(turn.audio_pcm16) / 2 / INPUT_SAMPLE_RATE * 1000 / AUDIO_IN_TOKEN_MS)
    images_in = sum(math.ceil(f.size[1] / IMAGE_PATCH_PX) * math.ceil(f.size[0] / IMAGE_PATCH_PX) for f in turn.frames)
    audio_out = math.ceil(speech_samples / TALKER_SAMPLE_RATE * 1000 / AUDIO_OUT_TOKEN_MS)
    return Usage(
        input_tokens=text_in + audio_in + images_in,
        output_tokens=answer_words + audio_out,
        input_text_tokens=text_in,
        input_audio_tokens=audio_in,
        input_image_tokens=images_in,
        output_text_tokens=answer_words,
        output_audio_tokens=audio_out,
    )


def tone_voice(text: str) -> np.ndarray:
    """Speak text as one tone per word (pitch from the word), with short pauses between words."""
    pieces: list[np.ndarray] = []
    gap = np.zeros(int(0.03 * TALKER_SAMPLE_RATE), dtype=np.float32)
    fade = int(0.005 * TALKER_SAMPLE_RATE)
    for word in text.split():
        duration = min(0.08 + 0.03 * len(word), 0.4)
        freq = 220.0 + (zlib.crc32(word.encode()) % 440)
        t = np.arange(int(duration * TALKER_SAMPLE_RATE), dtype=np.float32) / TALKER_SAMPLE_RATE
        tone = 0.3 * np.sin(2 * np.pi * freq * t).astype(np.float32)
        tone[:fade] *= np.linspace(0, 1, fade, dtype=np.float32)
        tone[-fade:] *= np.linspace(1, 0, fade, dtype=np.float32)
        pieces += [tone, gap]
    return np.concatenate(pieces) if pieces else np.zeros(0, dtype=np.float32)


def espeak_voice(text: str) -> np.ndarray:
    """Speak text with espeak-ng, resampled to the talker rate."""
    wav_bytes = subprocess.run(
        ["espeak-ng", "--stdout", "-s", "170", text], check=True, capture_output=True, timeout=30
    ).stdout
    with wave.open(io.BytesIO(wav_bytes)) as wav:
        rate, pcm = wav.getframerate(), wav.readframes(wav.getnframes())
    frame = av.AudioFrame.from_ndarray(np.frombuffer(pcm, dtype="<i2").reshape(1, -1), format="s16", layout="mono")
    frame.sample_rate = rate
    resampler = av.AudioResampler(format="flt", layout="mono", rate=TALKER_SAMPLE_RATE)
    out = [f.to_ndarray().reshape(-1) for f in resampler.resample(frame) + resampler.resample(None)]
    return np.concatenate(out).astype(np.float32) if out else np.zeros(0, dtype=np.float32)


Timeline = list[tuple[float, UnderstandOutput]]  # each output at its second after the request


class SyntheticEngine:
    """CPU-only, deterministic understanding engine (the default)."""

    name = "synthetic"

    def __init__(
        self,
        ttft: float = 0.15,
        token_rate: float = 40.0,
        audio_speed: float = 4.0,
        voice: str = "auto",
        transcriber: Transcriber | None = None,
    ) -> None:
        self.ttft = ttft
        self.token_rate = token_rate
        self.audio_speed = audio_speed
        if voice == "auto":
            voice = "espeak" if shutil.which("espeak-ng") else "tone"
        self.voice = voice
        self.transcriber = transcriber  # the embedded recogniser, when installed (engines/whisper.py)
        self._active: set[str] = set()
        self._aborted: set[str] = set()
        # The last requests aborted, newest last: lets operators and tests see what was cut.
        self.recent_aborts: deque[str] = deque(maxlen=64)

    def _speak(self, text: str) -> np.ndarray:
        return espeak_voice(text) if self.voice == "espeak" else tone_voice(text)

    calls_tools = True

    async def generate(self, turn: UnderstandTurn) -> AsyncIterator[UnderstandOutput]:
        call = chosen_call(turn)
        if call is not None:
            timeline = self._call_timeline(turn, *call)
        else:
            timeline = await self._answer_timeline(turn)
        loop = asyncio.get_running_loop()
        began = loop.time()
        self._active.add(turn.request_id)
        try:
            for at, output in timeline:
                delay = began + at - loop.time()
                if delay > 0:
                    await asyncio.sleep(delay)
                if turn.request_id in self._aborted:
                    return
                yield output
        finally:
            self._active.discard(turn.request_id)
            self._aborted.discard(turn.request_id)

    def _call_timeline(self, turn: UnderstandTurn, tool: FunctionTool, arguments: str) -> Timeline:
        """A call and nothing else: its arguments stream a piece per token after the first token."""
        call_id = f"call_{uuid.uuid4().hex[:16]}"
        pieces = [arguments[i : i + ARGUMENT_DELTA_CHARS] for i in range(0, len(arguments), ARGUMENT_DELTA_CHARS)]
        timeline: Timeline = [(self.ttft, FunctionCallStarted(call_id, tool.name))]
        timeline += [
            (self.ttft + (i + 1) / self.token_rate, FunctionArguments(call_id, piece)) for i, piece in enumerate(pieces)
        ]
        timeline.append((timeline[-1][0], count_usage(turn, len(pieces) + 1, 0)))
        return timeline

    async def _answer_timeline(self, turn: UnderstandTurn) -> Timeline:
        report = tool_report(turn)
        said = [report] if report is not None else []
        if report is None or turn.query or turn.audio_pcm16:  # the user's input is answered too
            said.append((await asyncio.to_thread(analyse, turn)).describe())
        answer = " ".join(said)
        words = answer.split(" ")
        # Text timeline: one word per token after the time to first token.
        timeline: Timeline = [
            (self.ttft + i / self.token_rate, TextDelta(word if i == 0 else " " + word)) for i, word in enumerate(words)
        ]
        speech = np.zeros(0, dtype=np.float32)
        if "audio" in turn.modalities:
            speech = await asyncio.to_thread(self._speak, answer)
            # The talker starts once the first sentence is written, like vLLM-Omni's async chunking.
            first_sentence_words = len(answer.split(".")[0].split(" "))
            at = self.ttft + first_sentence_words / self.token_rate
            start, chunk_s = 0, FIRST_AUDIO_CHUNK_S
            while start < speech.size:
                end = min(speech.size, start + int(chunk_s * TALKER_SAMPLE_RATE))
                at += (end - start) / TALKER_SAMPLE_RATE / self.audio_speed
                timeline.append((at, AudioChunk(speech[start:end])))
                start, chunk_s = end, AUDIO_CHUNK_S
        timeline.sort(key=lambda item: item[0])
        timeline.append((timeline[-1][0], count_usage(turn, len(words), speech.size)))
        return timeline

    async def abort(self, request_id: str) -> None:
        if request_id in self._active:
            self._aborted.add(request_id)
        self.recent_aborts.append(request_id)

    async def close(self) -> None:
        self._active.clear()
        self._aborted.clear()
