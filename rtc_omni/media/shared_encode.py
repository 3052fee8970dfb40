"""One encode per codec for all viewers of a session's outgoing track.

aiortc encodes once per frame per sender. Instead, a `SharedEncoder` reads the outgoing track
once, encodes each frame once for one codec with PyAV, and hands every subscriber the same
`av.Packet`; aiortc's sender only packetizes a packet (interop.md 1.2). A source that yields
packets itself (the talker, already Opus) is passed through as it is. Video gets a keyframe every
KEYFRAME_INTERVAL_S of media time, and a subscriber (new, or one that fell too far behind) starts
at the next keyframe. aiortc's sender cannot pass a viewer's keyframe request (PLI, FIR) on to a
pre-encoded source, so patches/keyframes.py passes them on: the next frame is encoded as a keyframe
for every viewer, at most once per MIN_KEYFRAME_GAP_S. Lost packets are resent by aiortc itself
(NACK, with RTX when negotiated) from its history of sent packets.
"""

from __future__ import annotations

import asyncio
import fractions
from collections import deque
from collections.abc import Callable

import av
from aiortc.codecs.h264 import DEFAULT_BITRATE as H264_BITRATE
from aiortc.codecs.vpx import DEFAULT_BITRATE as VP8_BITRATE
from aiortc.mediastreams import MediaStreamError, MediaStreamTrack
from av.video.codeccontext import VideoCodecContext
from av.video.reformatter import VideoReformatter

KEYFRAME_INTERVAL_S = 1.0
MIN_KEYFRAME_GAP_S = 0.25  # between keyframes asked for by viewers: a PLI flood costs little bitrate
MAX_QUEUED_PACKETS = 64  # per subscriber; beyond it the backlog is dropped (video resumes at a keyframe)
SHARED_CODECS = ("video/h264", "video/vp8", "audio/opus")


class EncodedTrack(MediaStreamTrack):
    """One viewer's feed of a SharedEncoder: recv() returns encoded packets, oldest first."""

    def __init__(
        self, kind: str, on_stop: Callable[[EncodedTrack], None], on_keyframe_request: Callable[[], None]
    ) -> None:
        super().__init__()
        self.kind = kind
        self._on_stop = on_stop
        self.request_keyframe = on_keyframe_request
        self._packets: deque[av.Packet] = deque()
        self._arrived = asyncio.Event()
        self._needs_keyframe = kind == "video"

    def put(self, packet: av.Packet) -> None:
        if len(self._packets) >= MAX_QUEUED_PACKETS:
            self._packets.clear()
            self._needs_keyframe = self.kind == "video"
        if self._needs_keyframe and not packet.is_keyframe:
            return
        self._needs_keyframe = False
        self._packets.append(packet)
        self._arrived.set()

    async def recv(self) -> av.Packet:  # type: ignore[override]
        while not self._packets:
            if self.readyState != "live":
                raise MediaStreamError
            self._arrived.clear()
            await self._arrived.wait()
        return self._packets.popleft()

    def stop(self) -> None:
        if self.readyState == "live":
            super().stop()
            self._arrived.set()
            self._on_stop(self)


class SharedEncoder:
    """Encodes `source` for one codec (one of SHARED_CODECS) while it has subscribers.

    `on_idle` runs once the last subscriber stops; the encoder has then stopped itself and `source`.
    """

    def __init__(self, source: MediaStreamTrack, mime_type: str, on_idle: Callable[[], object]) -> None:
        if mime_type not in SHARED_CODECS:
            raise ValueError(f"no shared encoder for {mime_type}")
        self.source = source
        self.mime_type = mime_type
        self._on_idle = on_idle
        self._subscribers: list[EncodedTrack] = []
        self._video: VideoCodecContext | None = None
        self._reformatter = VideoReformatter()
        self._first_pts: int | None = None
        self._last_keyframe_s: float | None = None
        self._keyframe_requested = False
        self._task = asyncio.ensure_future(self._run())

    @property
    def subscribers(self) -> int:
        return len(self._subscribers)

    def subscribe(self) -> EncodedTrack:
        track = EncodedTrack(self.source.kind, self._unsubscribe, self.request_keyframe)
        self._subscribers.append(track)
        return track

    def request_keyframe(self) -> None:
        """A viewer lost picture data (PLI or FIR): make a coming frame a keyframe for all."""
        self._keyframe_requested = True

    def _unsubscribe(self, track: EncodedTrack) -> None:
        if track in self._subscribers:
            self._subscribers.remove(track)
        if not self._subscribers:
            self.stop()
            self._on_idle()

    def stop(self) -> None:
        """Stop encoding, the source and every subscriber; idempotent."""
        self._task.cancel()
        self.source.stop()
        for track in list(self._subscribers):
            track.stop()

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        try:
            while True:
                frame = await self.source.recv()
                if isinstance(frame, av.Packet):  # the talker encodes once for all its consumers
                    packets = [frame]
                else:
                    packets = await loop.run_in_executor(None, self._encode, frame)
                for packet in packets:
                    for track in self._subscribers:
                        track.put(packet)
        except MediaStreamError:
            self.stop()

    def _encode(self, frame: av.frame.Frame | av.Packet) -> list[av.Packet]:
        if not isinstance(frame, av.VideoFrame):
            raise TypeError(f"cannot encode {type(frame).__name__}: audio comes encoded from the talker")
        packets = self._encode_video(frame)
        for packet in packets:  # every stream starts at 0
            if self._first_pts is None:
                self._first_pts = packet.pts or 0
            packet.pts = (packet.pts or 0) - self._first_pts
        return packets

    def _encode_video(self, frame: av.VideoFrame) -> list[av.Packet]:
        codec = self._video
        if codec is None or (codec.width, codec.height) != (frame.width, frame.height):
            codec = self._video = self._open_video(frame)
            self._last_keyframe_s = None
        seconds = float(frame.pts * frame.time_base) if frame.pts is not None and frame.time_base else 0.0
        since = None if self._last_keyframe_s is None else seconds - self._last_keyframe_s
        asked = self._keyframe_requested and (since is None or since >= MIN_KEYFRAME_GAP_S)
        due = since is None or since >= KEYFRAME_INTERVAL_S or asked
        # Our own reformatter: the frame's cached one is shared with the creator's sender thread.
        frame = self._reformatter.reformat(frame, format="yuv420p")
        frame.pict_type = av.video.frame.PictureType.I if due else av.video.frame.PictureType.NONE
        if due:
            self._last_keyframe_s = seconds
            self._keyframe_requested = False
        return list(codec.encode(frame))

    def _open_video(self, frame: av.VideoFrame) -> VideoCodecContext:
        h264 = self.mime_type == "video/h264"
        codec = av.CodecContext.create("libx264" if h264 else "libvpx", "w")
        assert isinstance(codec, VideoCodecContext)
        codec.width, codec.height, codec.pix_fmt = frame.width, frame.height, "yuv420p"
        codec.time_base = frame.time_base or fractions.Fraction(1, 90_000)
        codec.framerate = fractions.Fraction(30, 1)
        codec.gop_size = 3000  # keyframes come from KEYFRAME_INTERVAL_S instead
        if h264:  # what aiortc's own H.264 encoder uses; Annex-B with SPS/PPS before each IDR
            codec.bit_rate = H264_BITRATE
            codec.profile = "Baseline"
            codec.options = {"level": "31", "tune": "zerolatency"}
        else:
            codec.bit_rate = VP8_BITRATE
            codec.options = {"deadline": "realtime", "cpu-used": "-6", "lag-in-frames": "0"}
        return codec
