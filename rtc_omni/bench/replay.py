"""A load generator that costs the server what real peers cost it, and costs the benchmark little.

The benchmark's camera and mic are encoded once, up front, into a loop of a few seconds; every
peer then replays the same encoded frames through its own aiortc `RTCRtpSender`, which gives them
the peer's own SSRC, sequence numbers, RTP timestamps and VP8 picture ids. aiortc's sender
packetizes an `av.Packet` that a track hands it instead of encoding a frame (the path of its
`MediaPlayer(decode=False)`), so no peer encodes anything and N is bounded by the server, not by N
encoders on the same cores.
"""

from __future__ import annotations

import asyncio
import fractions
import functools
import time
from dataclasses import dataclass
from typing import TypeVar

import av
import numpy as np
from aiortc.mediastreams import MediaStreamError, MediaStreamTrack

from ..client.media import AUDIO_RATE, camera_send_bitrate, camera_send_fps
from ..client.rtc_peers import DEFAULT_SAMPLE_FPS, MediaClient
from ..config import TALKER_PACKET_MS_CHOICES as PACKET_MS_CHOICES
from ..signaling.ptime import asked_ptime_ms
from .understand_latency import CAMERA, camera

LOOP_SECONDS = 4  # whole seconds, so the mic's tone loops without a click
# What a camera sends a session at the default sampling rate (the page's maxFramerate, the headless
# client's cap: camera_send_fps), so the server decodes what real peers now send it.
CAMERA_FPS = round(camera_send_fps(DEFAULT_SAMPLE_FPS))
VIDEO_CLOCK_RATE = 90_000
# A camera's sensor noise (standard deviation, 8-bit levels): without it the flat test picture
# compresses to ~150 kb/s at 30 fps; with it, it fills whatever bitrate it is given, as a real
# camera fills a browser's cap.
SENSOR_NOISE = 2.0
# libvpx's real-time rate control starts this picture far under its target (a first keyframe of
# ~600 bytes) and averages 40-75 % of it over the loop, so the target is raised until the loop
# averages the page's bitrate within this fraction, in at most RATE_TRIES encodes. What it sends
# grows about as the target's 1.6th power here, hence RATE_STEP.
RATE_TOLERANCE = 0.1
RATE_TRIES = 6
RATE_STEP = 0.6
MIC_BITRATE = 32_000  # a browser's Opus rate for a mono voice
MIC_TONE_HZ = 440.0
MIC_PACKET_MS = 20  # a browser's, unless the answer asks for more (a=ptime; Chromium honours it)
SENT_AT_BOUND = 10_000
Peer = TypeVar("Peer", bound=MediaClient)


@dataclass(frozen=True)
class EncodedLoop:
    """A source encoded once: frames of `ticks` each in a `clock_rate` clock, the first a keyframe."""

    kind: str  # "audio" | "video"
    frames: tuple[bytes, ...]
    clock_rate: int
    ticks: int

    @property
    def seconds(self) -> float:
        return len(self.frames) * self.ticks / self.clock_rate

    @property
    def bytes_per_second(self) -> float:
        return sum(len(f) for f in self.frames) / self.seconds


def realtime_vp8_encoder(width: int, height: int, fps: int, bitrate: int) -> av.VideoCodecContext:
    """libvpx as a WebRTC sender runs it: real-time, constant rate, one output frame per input."""
    codec = av.CodecContext.create("libvpx", "w")
    assert isinstance(codec, av.VideoCodecContext)
    codec.width, codec.height, codec.pix_fmt = width, height, "yuv420p"
    codec.time_base = fractions.Fraction(1, fps)
    codec.framerate = fractions.Fraction(fps, 1)
    codec.bit_rate = bitrate
    rate = str(bitrate)
    codec.options = {"deadline": "realtime", "cpu-used": "8", "lag-in-frames": "0"}
    codec.options |= {"minrate": rate, "maxrate": rate, "bufsize": rate}
    return codec


@functools.cache
def encode_camera(fps: int, seconds: int = LOOP_SECONDS) -> EncodedLoop:
    """The benchmark's camera (640x480, a moving block, sensor noise) at `fps` as VP8, one keyframe
    at the loop's start, averaging the bitrate the page sends at `fps` (camera_send_bitrate)."""
    wanted = camera_send_bitrate(fps)
    target = wanted
    for _ in range(RATE_TRIES):
        loop = _encode_camera_at(fps, seconds, target)
        sent = loop.bytes_per_second * 8
        if abs(sent - wanted) <= RATE_TOLERANCE * wanted:
            return loop
        target = round(target * (wanted / sent) ** RATE_STEP)
    raise RuntimeError(f"libvpx averaged {sent / 1000:.0f} kb/s for the {wanted / 1000:.0f} kb/s wanted")


def _encode_camera_at(fps: int, seconds: int, bitrate: int) -> EncodedLoop:
    width, height, _ = CAMERA
    count = seconds * fps
    codec = realtime_vp8_encoder(width, height, fps, bitrate)
    codec.gop_size = count  # the replay starts over at a keyframe, as a decoder joining it needs
    source, noise = camera(), np.random.default_rng(0)
    packets: list[av.Packet] = []
    for index in range(count):
        source.frames_sent = index
        noisy = source.image() + noise.normal(0.0, SENSOR_NOISE, (height, width, 3))
        frame = av.VideoFrame.from_ndarray(np.clip(noisy, 0, 255).astype(np.uint8), format="rgb24").reformat(
            format="yuv420p"
        )
        frame.pts = index
        packets.extend(codec.encode(frame))
    packets.extend(codec.encode(None))
    if len(packets) != count or not packets[0].is_keyframe:
        raise RuntimeError(f"libvpx gave {len(packets)} frames for {count}, first keyframe: {packets[0].is_keyframe}")
    return EncodedLoop("video", tuple(bytes(p) for p in packets), VIDEO_CLOCK_RATE, VIDEO_CLOCK_RATE // fps)


@functools.cache
def encode_mic(packet_ms: int = MIC_PACKET_MS, seconds: int = LOOP_SECONDS) -> EncodedLoop:
    """A 440 Hz mic as mono Opus in `packet_ms` packets, as a browser sends a voice."""
    codec = av.CodecContext.create("libopus", "w")
    codec.sample_rate, codec.layout, codec.format = AUDIO_RATE, "mono", "s16"
    codec.bit_rate = MIC_BITRATE
    codec.options = {"application": "voip", "frame_duration": str(packet_ms)}
    samples_per_packet = AUDIO_RATE * packet_ms // 1000
    count = seconds * AUDIO_RATE // samples_per_packet
    t = np.arange(seconds * AUDIO_RATE) / AUDIO_RATE
    pcm = (0.3 * np.sin(2 * np.pi * MIC_TONE_HZ * t) * 32767).astype(np.int16)
    packets: list[av.Packet] = []
    for index in range(count):
        samples = pcm[index * samples_per_packet : (index + 1) * samples_per_packet]
        frame = av.AudioFrame.from_ndarray(samples.reshape(1, -1), format="s16", layout="mono")
        frame.sample_rate, frame.pts = AUDIO_RATE, index * samples_per_packet
        packets.extend(codec.encode(frame))
    packets.extend(codec.encode(None))
    if len(packets) < count:
        raise RuntimeError(f"libopus gave {len(packets)} packets for {count} frames")
    return EncodedLoop("audio", tuple(bytes(p) for p in packets[:count]), AUDIO_RATE, samples_per_packet)


def mic_packet_ms(answer_sdp: str | None) -> int:
    """The packet time a browser's mic uses for this answer: its a=ptime, as far as Opus's packet
    sizes go (the server asks for 60 ms: signaling/ptime.py), else MIC_PACKET_MS."""
    asked = asked_ptime_ms(answer_sdp or "")
    if asked is None:
        return MIC_PACKET_MS
    return max([ms for ms in PACKET_MS_CHOICES if ms <= asked], default=PACKET_MS_CHOICES[0])


class ReplayTrack(MediaStreamTrack):
    """Hands out a loop's encoded frames as `av.Packet`s in real time, from the first frame on, over
    and over; remembers when each frame left (by pts) for latency measurements."""

    pre_encoded = True  # no frame may be dropped on the way (MediaClient caps raw cameras only)

    def __init__(self, loop: EncodedLoop) -> None:
        super().__init__()
        self.kind = loop.kind
        self.loop = loop
        self.client: MediaClient | None = None  # a mic's: it replays at its answer's packet time
        self.frames_sent = 0
        self.sent_at: dict[int, float] = {}  # pts -> monotonic time recv() handed it to the sender
        self._time_base = fractions.Fraction(1, loop.clock_rate)
        self._start: float | None = None

    async def recv(self) -> av.Packet:
        if self.readyState != "live":
            raise MediaStreamError
        if self.frames_sent == 0 and self.client is not None and self.kind == "audio":
            # the sender asks for the first packet once connected, after the answer arrived
            self.loop = encode_mic(mic_packet_ms(self.client.answer_sdp))
        pts = self.frames_sent * self.loop.ticks
        if self._start is None:
            self._start = time.time()
        elif (wait := self._start + pts / self.loop.clock_rate - time.time()) > 0:
            await asyncio.sleep(wait)
        packet = av.Packet(self.loop.frames[self.frames_sent % len(self.loop.frames)])
        packet.pts, packet.time_base = pts, self._time_base
        self.sent_at[pts] = time.monotonic()
        if len(self.sent_at) > SENT_AT_BOUND:
            self.sent_at.pop(next(iter(self.sent_at)))
        self.frames_sent += 1
        return packet


def replaying_client(url: str, client_class: type[Peer], camera_fps: int = CAMERA_FPS) -> Peer:
    """A peer whose camera (VP8) and mic (Opus, at the answer's packet time) replay the shared loops,
    and that hears the talker."""
    mic = ReplayTrack(encode_mic())
    client = client_class(url, video=ReplayTrack(encode_camera(camera_fps)), audio=mic, video_codec="vp8")
    mic.client = client
    return client
