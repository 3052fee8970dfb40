"""aiortc patches: hand decoded frames to the loop cheaply, and decode microphones on the loop at 16 kHz mono.

aiortc decodes every received frame in a thread per receiver and hands each decoded frame back
with `asyncio.run_coroutine_threadsafe(queue.put(frame))`: a coroutine, a Task and a concurrent
Future per frame. Two changes:

- `decoder_worker` (process-wide): the same thread loop, but each decode's frames go back in one
  `loop.call_soon_threadsafe`. Relies on aiortc.rtcrtpreceiver looking `decoder_worker` up when a
  receiver starts, with the arguments (loop, input queue, track queue, decode-error event).
- `decode_audio_on_the_loop(pc)` (per peer connection): an audio receiver's encoded frames are
  decoded as they leave the jitter buffer, on the loop (Opus decodes a 20 ms packet in ~20 µs,
  less than the thread hop costs), to mono, and resampled to the 16 kHz the sessions consume, so
  ingest does no conversion. Relies on RTCRtpReceiver's name-mangled `__decoder_queue` (only
  `put` and `get` are used) and RemoteStreamTrack's `_queue`; aiortc's decoder thread still
  starts, and only waits for the end. A gap in the RTP timestamps (a lost packet, a sender's DTX
  pause) is decoded as that much silence, so the mic's audio keeps media time: the VAD's
  positions, its pauses and the echo check's alignment stay true after a loss. The silence is
  bounded: at most 2 s per gap, and never more than the wall clock allows.

Remove when aiortc hands frames over without a task per frame, and lets a receiver choose its
decoder's output format (no upstream issue yet).
"""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
import time
from collections.abc import Callable
from typing import Any

import aiortc.rtcrtpreceiver
import av
from aiortc import RTCPeerConnection, RTCRtpCodecParameters
from aiortc.codecs import get_decoder
from aiortc.codecs.base import Decoder
from aiortc.jitterbuffer import JitterFrame
from av.audio.codeccontext import AudioCodecContext

from ..pcm import INPUT_SAMPLE_RATE

logger = logging.getLogger(__name__)

AIORTC_DECODER_WORKER = aiortc.rtcrtpreceiver.decoder_worker
OPUS_DECODE_RATE = 48_000  # libopus through FFmpeg always decodes at 48 kHz
# A forward timestamp jump up to this long is a loss or a pause, and is filled; a longer one is a
# restarted stream (a new random timestamp), and is not.
MAX_GAP_S = 30.0
MAX_FILL_S = 2.0  # silence enough to end any turn, whatever the pause
# The stream's audio, decoded and filled, never runs further ahead of the wall clock than this: a
# peer that jumps its timestamps on every packet gets no more silence than time has passed.
FILL_AHEAD_S = 1.0


def _deliver(track_queue: asyncio.Queue[Any], frames: list[Any]) -> None:
    for frame in frames:
        track_queue.put_nowait(frame)


def _hand_over(loop: asyncio.AbstractEventLoop, track_queue: asyncio.Queue[Any], frames: list[Any]) -> None:
    try:
        loop.call_soon_threadsafe(_deliver, track_queue, frames)
    except RuntimeError:  # the loop closed under a receiver still stopping: nobody is listening
        pass


def decoder_worker(
    loop: asyncio.AbstractEventLoop,
    input_q: queue.Queue[tuple[RTCRtpCodecParameters, JitterFrame] | None],
    output_q: asyncio.Queue[Any],
    decode_error: threading.Event,
) -> None:
    """aiortc's decoder thread: decode each queued frame; None ends the track."""
    decoder: Decoder | None = None
    codec_name: str | None = None
    while (task := input_q.get()) is not None:
        codec, encoded_frame = task
        if decoder is None or codec.name != codec_name:
            decoder, codec_name = get_decoder(codec), codec.name
        try:
            frames = decoder.decode(encoded_frame)
        except av.FFmpegError as exc:  # the decoder keeps its state: the next keyframe repairs it
            logger.warning("failed to decode a %s frame: %s", codec.mimeType, exc)
            decode_error.set()
            continue
        if frames:
            _hand_over(loop, output_q, frames)
    _hand_over(loop, output_q, [None])


class MicDecoder:
    """Stands in for an audio receiver's decoder queue: each `put` decodes there and then.

    Opus becomes 16 kHz mono PCM16 frames; other codecs (PCMU, PCMA) are decoded by aiortc's
    decoder and left to ingest's resampler. `get` serves aiortc's idle decoder thread its end.
    """

    def __init__(self, track_queue: asyncio.Queue[Any], clock: Callable[[], float] = time.monotonic) -> None:
        self._track_queue = track_queue
        self._clock = clock
        self._end: queue.Queue[None] = queue.Queue()
        self._codec_name: str | None = None
        self._decoder: AudioCodecContext | Decoder | None = None
        self._resampler = av.AudioResampler(format="s16", layout="mono", rate=INPUT_SAMPLE_RATE)
        self._next_timestamp: int | None = None  # where the next packet's audio should start
        self._last_duration = 0  # RTP clock units in the last packet decoded
        self._format: av.AudioFrame | None = None  # a decoded frame: the format silence is made in
        self._first_at = 0.0  # when the first packet came, on `clock`
        self._media = 0  # RTP clock units handed on since then, decoded and filled

    def put(self, task: tuple[RTCRtpCodecParameters, JitterFrame] | None) -> None:
        if task is None:
            self._end.put(None)
            return
        codec, encoded_frame = task
        try:
            frames = self._decode(codec, encoded_frame)
        except (av.FFmpegError, ValueError) as exc:
            logger.warning("failed to decode a %s frame: %s", codec.mimeType, exc)
            return
        gap = self._gap(codec.clockRate, encoded_frame.timestamp)
        if self._format is not None and (missing := gap * self._format.sample_rate // codec.clockRate) > 0:
            self._track_queue.put_nowait(silence_like(self._format, missing))
        if frames:
            self._format = frames[0]
            for frame in frames:
                self._track_queue.put_nowait(frame)

    def _gap(self, clock_rate: int, timestamp: int) -> int:
        """RTP clock units of silence to hand on before the packet at `timestamp`: the audio missing
        since the last one (none for a restart), within MAX_FILL_S and the wall clock's lead."""
        expected, self._next_timestamp = self._next_timestamp, (timestamp + self._last_duration) % 2**32
        if expected is None:
            self._first_at, self._media = self._clock(), self._last_duration
            return 0
        gap = (timestamp - expected) % 2**32
        lead = round((self._clock() - self._first_at + FILL_AHEAD_S) * clock_rate) - self._media
        fill = min(gap, round(MAX_FILL_S * clock_rate), max(0, lead)) if gap <= MAX_GAP_S * clock_rate else 0
        self._media += fill + self._last_duration
        return fill

    def get(self) -> None:
        return self._end.get()

    def _decode(self, codec: RTCRtpCodecParameters, encoded_frame: JitterFrame) -> list[av.AudioFrame]:
        if self._decoder is None or codec.name != self._codec_name:
            self._codec_name = codec.name
            self._decoder = opus_mono_decoder() if codec.name.lower() == "opus" else get_decoder(codec)
        if isinstance(self._decoder, Decoder):
            decoded: list[av.AudioFrame] = list(self._decoder.decode(encoded_frame))  # type: ignore[arg-type]
            self._last_duration = sum(f.samples * codec.clockRate // f.sample_rate for f in decoded)
            return decoded
        frames: list[av.AudioFrame] = []
        self._last_duration = 0
        for frame in self._decoder.decode(av.Packet(encoded_frame.data)):
            self._last_duration += frame.samples * codec.clockRate // frame.sample_rate
            frames += self._resampler.resample(frame)
        return frames


def silence_like(frame: av.AudioFrame, samples: int) -> av.AudioFrame:
    """`samples` of silence in `frame`'s format, layout and rate."""
    silent = av.AudioFrame(format=frame.format.name, layout=frame.layout.name, samples=samples)
    silent.sample_rate = frame.sample_rate
    for plane in silent.planes:
        plane.update(bytes(plane.buffer_size))
    return silent


def opus_mono_decoder() -> AudioCodecContext:
    codec = av.CodecContext.create("libopus", "r")
    assert isinstance(codec, AudioCodecContext)
    codec.format, codec.layout, codec.sample_rate = "s16", "mono", OPUS_DECODE_RATE
    return codec


def decode_audio_on_the_loop(pc: RTCPeerConnection) -> None:
    """Give every audio receiver of `pc` a MicDecoder; call before media flows (after
    setRemoteDescription, before the answer)."""
    for transceiver in pc.getTransceivers():
        receiver = transceiver.receiver
        if transceiver.kind == "audio" and receiver.track is not None:  # None: the peer sends no audio
            receiver._RTCRtpReceiver__decoder_queue = MicDecoder(receiver.track._queue)  # type: ignore[attr-defined]


def install() -> None:
    aiortc.rtcrtpreceiver.decoder_worker = decoder_worker  # type: ignore[assignment]
