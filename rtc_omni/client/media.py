"""Media a headless peer sends and receives: synthetic camera and mic, talker recorder, video receiver."""

from __future__ import annotations

import asyncio
import fractions
import time
import wave
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import av
import numpy as np
from aiortc.contrib.media import MediaPlayer
from aiortc.mediastreams import MediaStreamError, MediaStreamTrack, VideoStreamTrack
from av.frame import Frame
from av.packet import Packet

from ..engines.synthetic import espeak_voice
from ..media import blockcode
from ..media.ingest import FrameSampler, iter_frames
from ..media.recorder import Mp4Recorder
from ..pcm import float_to_pcm16, pcm16_to_float

AUDIO_RATE = 48_000
AUDIO_FRAME_SAMPLES = 960
_AUDIO_TIME_BASE = fractions.Fraction(1, AUDIO_RATE)

COLOURS: dict[str, tuple[int, int, int]] = {
    "red": (255, 0, 0),
    "green": (0, 255, 0),
    "blue": (0, 0, 255),
    "yellow": (255, 255, 0),
    "white": (255, 255, 255),
    "black": (0, 0, 0),
    "magenta": (255, 0, 255),
    "cyan": (0, 255, 255),
}


# A camera sends a session at least this many frames per second, whatever its sampling rate: a lost
# frame is repaired per frame (NACK, or a PLI answered by a keyframe on the sender's next frame).
MIN_SEND_FPS = 5.0


def camera_send_fps(sample_fps: float) -> float:
    """The frame rate a camera should send to a session sampling `sample_fps` frames per second.

    Twice the sampling rate: the server takes the first frame at or after each due time (media
    time), so every sample is then at most half an interval late; at exactly the sampling rate, a
    camera whose clock runs slightly fast is sampled at half the rate. The same rule runs in the
    browser page (static/js/talk.js); docs/protocol.md, "Camera frame rate", says more and has figures.
    """
    return max(2.0 * sample_fps, MIN_SEND_FPS)


# The page's camera bitrate follows its frame rate (static/js/talk.js cameraEncoding): this many bits
# a frame, 150 kb/s at 5 fps. docs/protocol.md, "Camera bitrate", has the legibility figures.
CAMERA_BITS_PER_FRAME = 30_000


def camera_send_bitrate(send_fps: float) -> int:
    """The bitrate the page's camera sends at `send_fps` (maxBitrate): bits per second.

    aiortc's encoder, the headless client's, cannot go below 250 kb/s, so only the page and the
    benchmark's replayed camera (rtc_omni/bench/replay.py) send it.
    """
    return round(CAMERA_BITS_PER_FRAME * send_fps)


class ColourVideoTrack(VideoStreamTrack):
    """A camera showing one colour; with `moving=True` a bright block sweeps across it.

    It captures at `fps`, or at `max_fps` when that is lower (what the peer asked the sender for).
    """

    def __init__(
        self,
        colour: tuple[int, int, int] = (255, 0, 0),
        width: int = 320,
        height: int = 240,
        fps: int = 30,
        moving: bool = False,
    ) -> None:
        super().__init__()
        self.colour = colour
        self.width, self.height, self.fps, self.moving = width, height, fps, moving
        self.max_fps: float | None = None
        self.frames_sent = 0
        self.sent_at: dict[int, float] = {}  # pts -> monotonic send time, for latency measurements

    async def next_timestamp(self) -> tuple[int, fractions.Fraction]:
        # VideoStreamTrack's pacing, at our frame rate instead of its fixed 30 fps.
        if self.readyState != "live":
            raise MediaStreamError
        clock_rate = 90_000
        if hasattr(self, "_timestamp"):
            self._timestamp += int(clock_rate / min(self.fps, self.max_fps or self.fps))
            wait = self._start + (self._timestamp / clock_rate) - time.time()
            if wait > 0:
                await asyncio.sleep(wait)
        else:
            self._start = time.time()
            self._timestamp = 0
        return self._timestamp, fractions.Fraction(1, clock_rate)

    def set_colour(self, colour: tuple[int, int, int]) -> None:
        self.colour = colour

    def image(self) -> np.ndarray:
        """The frame `frames_sent` would show (also the WebSocket benchmark's JPEG source)."""
        image = np.empty((self.height, self.width, 3), dtype=np.uint8)
        image[:] = self.colour
        if self.moving:
            block = max(8, self.width // 4)
            x = (self.frames_sent * 7) % max(1, self.width - block)
            inverse = tuple(255 - c for c in self.colour)
            image[:, x : x + block] = inverse
        return image

    async def recv(self) -> av.VideoFrame:
        pts, time_base = await self.next_timestamp()
        frame = av.VideoFrame.from_ndarray(self.image(), format="rgb24")
        frame.pts, frame.time_base = pts, time_base
        self.sent_at[pts] = time.monotonic()
        if len(self.sent_at) > 10_000:
            self.sent_at.pop(next(iter(self.sent_at)))
        self.frames_sent += 1
        return frame


class FrameRateCap(MediaStreamTrack):
    """A video track passing on at most `max_fps` of its source's frames, picked by media time.

    aiortc's RTCRtpSender has no setParameters and so no maxFramerate: a frame the sender never
    gets is a frame it never encodes and the server never decodes.
    """

    kind = "video"

    def __init__(self, source: MediaStreamTrack, max_fps: float | None = None) -> None:
        super().__init__()
        self.source = source
        self.max_fps = max_fps
        self._sampler = FrameSampler()

    async def recv(self) -> Frame | Packet:
        while True:
            frame = await self.source.recv()
            if self.max_fps is None:
                return frame
            at = float(frame.pts * frame.time_base) if frame.pts is not None and frame.time_base else time.monotonic()
            if self._sampler.take(at, self.max_fps):
                return frame

    def stop(self) -> None:
        super().stop()
        self.source.stop()


class PacedAudioTrack(MediaStreamTrack):
    """A 48 kHz mono microphone that hands out one 20 ms frame per 20 ms of wall time."""

    kind = "audio"

    def __init__(self) -> None:
        super().__init__()
        self._samples = 0
        self._start: float | None = None

    def _next_samples(self) -> np.ndarray:
        """The next AUDIO_FRAME_SAMPLES float samples in [-1, 1]."""
        raise NotImplementedError

    async def recv(self) -> av.AudioFrame:
        if self.readyState != "live":
            raise MediaStreamError
        if self._start is None:
            self._start = time.time()
        else:
            wait = self._start + self._samples / AUDIO_RATE - time.time()
            if wait > 0:
                await asyncio.sleep(wait)
        pcm = np.frombuffer(float_to_pcm16(self._next_samples()), dtype="<i2").reshape(1, -1)
        frame = av.AudioFrame.from_ndarray(pcm, format="s16", layout="mono")
        frame.sample_rate, frame.pts, frame.time_base = AUDIO_RATE, self._samples, _AUDIO_TIME_BASE
        self._samples += AUDIO_FRAME_SAMPLES
        return frame


class ToneAudioTrack(PacedAudioTrack):
    """A microphone playing a sine tone (frequency 0 = silence)."""

    def __init__(self, frequency: float = 440.0, amplitude: float = 0.3) -> None:
        super().__init__()
        self.frequency, self.amplitude = frequency, amplitude

    def _next_samples(self) -> np.ndarray:
        t = (self._samples + np.arange(AUDIO_FRAME_SAMPLES)) / AUDIO_RATE
        if not self.frequency:
            return np.zeros(AUDIO_FRAME_SAMPLES, dtype=np.float32)
        return (self.amplitude * np.sin(2 * np.pi * self.frequency * t)).astype(np.float32)


def speech48(text: str) -> np.ndarray:
    """espeak-ng saying `text`, as 48 kHz float samples trimmed to where the voice is."""
    speech24 = espeak_voice(text)
    frame = av.AudioFrame.from_ndarray(speech24.reshape(1, -1), format="flt", layout="mono")
    frame.sample_rate = 24_000
    resampler = av.AudioResampler(format="flt", layout="mono", rate=AUDIO_RATE)
    out = np.concatenate([f.to_ndarray().reshape(-1) for f in resampler.resample(frame) + resampler.resample(None)])
    loud = np.nonzero(np.abs(out) > 0.02)[0]
    return out[loud[0] : loud[-1] + 1]


NOISE_STEP_S = 0.2  # how often fluctuating noise changes its loudness: about a syllable's length


def noise(kind: Literal["pink", "fluctuating"], samples: int, rms: float, seed: int = 0) -> np.ndarray:
    """Float noise at this RMS, made up here: "pink" (-3 dB an octave, as a fan or traffic sounds) or
    "fluctuating" (pink whose loudness changes every NOISE_STEP_S at 48 kHz, as a crowd or a television
    does). Steady noise mostly slips past the VAD's noise floor; fluctuating noise starts turns."""
    rng = np.random.default_rng(seed)
    spectrum = np.fft.rfft(rng.standard_normal(samples))
    spectrum /= np.sqrt(np.maximum(np.arange(spectrum.size), 1))
    pink = np.fft.irfft(spectrum, samples)
    if kind == "fluctuating":
        step = int(NOISE_STEP_S * AUDIO_RATE)
        pink *= np.repeat(rng.uniform(0.1, 1.5, samples // step + 1), step)[:samples]
    return (pink * rms / np.sqrt(np.mean(pink * pink))).astype(np.float32)


class ScriptedAudioTrack(PacedAudioTrack):
    """A microphone that says what it is told: queued 48 kHz clips, silence in between, and
    optionally the sound of its own loudspeaker (an `AudioRecorder`'s frames) mixed in as echo.

    The loudspeaker plays like a device's: it starts once ECHO_PLAYOUT_PIECES are queued, and
    after running dry waits for as many again. Without that cushion every packet a loaded loop
    delivered late became a gap in the echo, which no loudspeaker behind a jitter buffer makes.
    """

    ECHO_PLAYOUT_PIECES = 8  # 160 ms: one 120 ms talker packet, and some

    def __init__(self, echo_gain: float = 0.0) -> None:
        super().__init__()
        self.echo_gain = echo_gain
        self.echo: asyncio.Queue[np.ndarray] = asyncio.Queue(maxsize=50)  # fed by an AudioRecorder
        self._echo_playing = False
        self._clips: deque[np.ndarray] = deque()
        self.clip_started_at: list[float] = []  # monotonic time each clip began to play
        self.clip_ended_at: list[float] = []

    def say(self, clip48: np.ndarray) -> None:
        """Queue float samples in [-1, 1] at 48 kHz."""
        self._clips.append(clip48.astype(np.float32))

    def _next_samples(self) -> np.ndarray:
        out = np.zeros(AUDIO_FRAME_SAMPLES, dtype=np.float32)
        filled = 0
        while filled < AUDIO_FRAME_SAMPLES and self._clips:
            clip = self._clips[0]
            if len(self.clip_started_at) == len(self.clip_ended_at):
                self.clip_started_at.append(time.monotonic())
            take = min(AUDIO_FRAME_SAMPLES - filled, clip.size)
            out[filled : filled + take] = clip[:take]
            filled += take
            if take == clip.size:
                self._clips.popleft()
                self.clip_ended_at.append(time.monotonic())
            else:
                self._clips[0] = clip[take:]
        if self.echo_gain:
            self._echo_playing = self.echo.qsize() >= (1 if self._echo_playing else self.ECHO_PLAYOUT_PIECES)
            if self._echo_playing:
                echo = self.echo.get_nowait()
                out[: echo.size] += self.echo_gain * echo[:AUDIO_FRAME_SAMPLES]
        return out


@dataclass(frozen=True)
class ReceivedAudioFrame:
    at: float  # monotonic seconds when it arrived
    rms: float  # 0..1


class _TrackDrain:
    """Drains a received track, and then the same session's track on each resumed connection."""

    def __init__(self, track: MediaStreamTrack) -> None:
        self.track = track
        self._tasks = [asyncio.ensure_future(self._run(track))]

    def follow(self, track: MediaStreamTrack) -> None:
        """Go on from `track`: the session's on a resumed connection (the old one's has ended)."""
        self.track = track
        self._tasks.append(asyncio.ensure_future(self._run(track)))

    async def _run(self, track: MediaStreamTrack) -> None:
        raise NotImplementedError

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)


class AudioRecorder(_TrackDrain):
    """Drains a received audio track, keeping each frame's arrival time and loudness (bounded)."""

    SILENCE_RMS = 0.01

    def __init__(self, track: MediaStreamTrack, keep_seconds: float = 600.0) -> None:
        max_frames = int(keep_seconds * AUDIO_RATE / AUDIO_FRAME_SAMPLES)
        self.frames: deque[ReceivedAudioFrame] = deque(maxlen=max_frames)
        self.pcm: deque[bytes] = deque(maxlen=max_frames)
        self.echo_to: asyncio.Queue[np.ndarray] | None = None  # a ScriptedAudioTrack's echo input
        super().__init__(track)

    async def _run(self, track: MediaStreamTrack) -> None:
        async for frame in iter_frames(track):
            # Kept in 20 ms pieces whatever the packet time (the talker sends 60 ms), so counts of
            # voiced frames stay counts of 20 ms.
            everything = frame.to_ndarray().reshape(-1, len(frame.layout.channels))[:, 0]
            step = frame.sample_rate // 50
            for start in range(0, everything.size, step):
                samples = everything[start : start + step]
                self.pcm.append(samples.astype("<i2").tobytes())
                if self.echo_to is not None and not self.echo_to.full():
                    self.echo_to.put_nowait(pcm16_to_float(samples))
                rms = float(np.sqrt(np.mean(pcm16_to_float(samples) ** 2)))
                self.frames.append(ReceivedAudioFrame(time.monotonic(), rms))

    def voiced_frames(self, since: float = 0.0, until: float = float("inf")) -> int:
        return sum(1 for f in self.frames if since <= f.at < until and f.rms >= self.SILENCE_RMS)

    def save_wav(self, path: str) -> None:
        with wave.open(path, "wb") as out:
            out.setnchannels(1)
            out.setsampwidth(2)
            out.setframerate(AUDIO_RATE)
            out.writeframes(b"".join(self.pcm))


def _open_media_file(spec: str, keywords: str) -> MediaPlayer:
    """A looping player of a media file or URL; a name that is neither says what was expected."""
    if "://" not in spec and not Path(spec).exists():
        raise ValueError(f"{spec!r} is not {keywords}, or an existing media file")
    return MediaPlayer(spec, loop=True)


def open_video_source(spec: str, fps: int = 30, size: tuple[int, int] = (640, 480)) -> MediaStreamTrack | None:
    """`testsrc` (moving pattern), `colour:NAME` (still), `none`, or a media file path."""
    width, height = size
    if spec == "none":
        return None
    if spec == "testsrc":
        return ColourVideoTrack((40, 90, 200), width, height, fps, moving=True)
    if spec.startswith("colour:") or spec.startswith("color:"):
        name = spec.split(":", 1)[1]
        if name not in COLOURS:
            raise ValueError(f"unknown colour {name!r}; choose from {', '.join(COLOURS)}")
        return ColourVideoTrack(COLOURS[name], width, height, fps)
    player = _open_media_file(spec, "testsrc, colour:NAME, none")
    if player.video is None:
        raise ValueError(f"{spec} has no video stream")
    return player.video


def open_audio_source(spec: str) -> MediaStreamTrack | None:
    """`tone` (440 Hz), `tone:HZ`, `silence`, `none`, or a media file path."""
    if spec == "none":
        return None
    if spec == "silence":
        return ToneAudioTrack(0.0)
    if spec == "tone":
        return ToneAudioTrack(440.0)
    if spec.startswith("tone:"):
        try:
            frequency = float(spec.split(":", 1)[1])
        except ValueError:
            raise ValueError(f"{spec!r}: the tone's frequency must be a number of hertz, e.g. tone:440") from None
        if not 0 <= frequency <= AUDIO_RATE / 2:
            raise ValueError(f"{spec!r}: the tone's frequency must be between 0 and {AUDIO_RATE // 2} Hz")
        return ToneAudioTrack(frequency)
    player = _open_media_file(spec, "tone, tone:HZ, silence, none")
    if player.audio is None:
        raise ValueError(f"{spec} has no audio stream")
    return player.audio


@dataclass(frozen=True)
class ReceivedVideoFrame:
    at: float  # monotonic seconds when it was decoded
    index: int  # the block-coded frame index (synthetic engines)
    mean_rgb: tuple[int, int, int]  # below the code band
    width: int
    height: int


class VideoReceiver(_TrackDrain):
    """Drains a received video track: arrival time, block code and colour of each frame, and
    optionally an MP4 of what arrived."""

    def __init__(
        self, track: MediaStreamTrack, out_path: str | None = None, fps: float = 24.0, keep_frames: int = 100_000
    ) -> None:
        self.frames: deque[ReceivedVideoFrame] = deque(maxlen=keep_frames)
        self.writer = Mp4Recorder(Path(out_path), fps) if out_path else None
        super().__init__(track)

    async def _run(self, track: MediaStreamTrack) -> None:
        async for frame in iter_frames(track):
            at = time.monotonic()
            rgb = frame.to_ndarray(format="rgb24")
            body = rgb[rgb.shape[0] // 5 :]
            mean = body.reshape(-1, 3).mean(axis=0)
            self.frames.append(
                ReceivedVideoFrame(
                    at, blockcode.read(rgb), (int(mean[0]), int(mean[1]), int(mean[2])), rgb.shape[1], rgb.shape[0]
                )
            )
            if self.writer is not None:
                await self.writer.write(rgb)

    async def stop(self) -> None:
        await super().stop()
        if self.writer is not None:
            await self.writer.finish()
