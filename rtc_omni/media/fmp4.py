"""Fragmented MP4 (H.264) streams, as vLLM-Omni's `/v1/realtime/video` sends generated video.

`FragmentedMp4Encoder` writes what vLLM-Omni's encoder writes, so its clients demux it unchanged: the
init segment (`ftyp` + `moov`) in the first output, then one `moof` + `mdat` fragment per frame.
The MP4 muxer writes a fragment when the next frame arrives, so each frame leaves one frame late
and the last one with `close()` (the trailer), exactly as upstream. `FragmentedMp4Decoder` is the
other end (the remote engine): it demuxes each received message with the init segment in front
and decodes the packets with one decoder that lives for the whole stream.
"""

from __future__ import annotations

import fractions
import io
import struct

import av
import numpy as np

MOVFLAGS = "+frag_every_frame+empty_moov+default_base_moof"
CODEC_OPTIONS = {"preset": "ultrafast", "threads": "0", "tune": "zerolatency", "crf": "18"}


class FragmentedMp4Encoder:
    """RGB frames in, fMP4 bytes out; `encode` returns only the bytes written since the last call."""

    def __init__(self, fps: float) -> None:
        self.fps = fps
        self._buffer = io.BytesIO()
        self._container: av.container.OutputContainer | None = None
        self._stream: av.VideoStream | None = None
        self._pts = 0

    def _open(self, width: int, height: int) -> None:
        self._container = av.open(self._buffer, mode="w", format="mp4", options={"movflags": MOVFLAGS})
        stream = self._container.add_stream("libx264", rate=fractions.Fraction(self.fps).limit_denominator(1001))
        stream.width, stream.height = width - width % 2, height - height % 2  # yuv420p needs even sizes
        stream.pix_fmt = "yuv420p"
        stream.codec_context.max_b_frames = 0
        stream.options = dict(CODEC_OPTIONS)
        self._stream = stream

    def _take(self) -> bytes:
        data = self._buffer.getvalue()
        self._buffer.seek(0)
        self._buffer.truncate()
        return data

    def encode(self, rgb: np.ndarray) -> bytes:
        if self._container is None:
            self._open(rgb.shape[1], rgb.shape[0])
        assert self._container is not None and self._stream is not None
        frame = av.VideoFrame.from_ndarray(
            np.ascontiguousarray(rgb[: self._stream.height, : self._stream.width]), format="rgb24"
        )
        frame.pts = self._pts
        self._pts += 1
        self._container.mux(self._stream.encode(frame))
        return self._take()

    def close(self) -> bytes:
        """The trailer: the held last fragment (empty when nothing was encoded)."""
        if self._container is None:
            return b""
        assert self._stream is not None
        self._container.mux(self._stream.encode(None))
        self._container.close()
        self._container = None
        return self._take()


def split_init_segment(data: bytes) -> tuple[bytes, bytes]:
    """(init segment, the rest): the top-level boxes before the first `moof`."""
    offset = 0
    while offset + 8 <= len(data):
        size, box = struct.unpack(">I4s", data[offset : offset + 8])
        if box == b"moof":
            break
        if size == 1 and offset + 16 <= len(data):
            size = struct.unpack(">Q", data[offset + 8 : offset + 16])[0]
        if size < 8:
            raise ValueError(f"malformed MP4 box {box!r} at offset {offset}")
        offset += size
    return data[:offset], data[offset:]


class FragmentedMp4Decoder:
    """fMP4 messages in (the first carries the init segment), RGB frames out."""

    def __init__(self) -> None:
        self._init: bytes | None = None
        self._codec: av.VideoCodecContext | None = None

    def decode(self, message: bytes) -> list[np.ndarray]:
        if self._init is None:
            self._init, message = split_init_segment(message)
            if not self._init:
                raise ValueError("the first fMP4 message has no init segment")
        if not message:
            return []
        frames: list[np.ndarray] = []
        with av.open(io.BytesIO(self._init + message), mode="r", format="mp4") as container:
            stream = container.streams.video[0]
            if self._codec is None:
                codec = av.CodecContext.create(stream.codec_context.name, "r")
                assert isinstance(codec, av.VideoCodecContext)
                codec.extradata = stream.codec_context.extradata
                self._codec = codec
            for packet in container.demux(stream):
                if packet.size:
                    frames.extend(f.to_ndarray(format="rgb24") for f in self._codec.decode(packet))
        return frames
