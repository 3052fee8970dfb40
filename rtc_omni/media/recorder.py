"""MP4 recording of exactly the frames a generation session sent (H.264 through PyAV)."""

from __future__ import annotations

import asyncio
import fractions
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import av
import numpy as np


class Mp4Recorder:
    """Encodes frames on one worker thread, one at a time, so none is lost and none waits long.

    With `max_bytes`, the file is finished (and stays playable) once its encoded video reaches that
    size: `full` is then set and later frames are not recorded.
    """

    def __init__(self, path: Path, fps: float, max_bytes: int | None = None) -> None:
        self.path = path
        self.fps = fps
        self.max_bytes = max_bytes
        self.full = False
        self.frames = 0
        self.bytes = 0  # encoded video so far
        self.size: tuple[int, int] | None = None
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="mp4-recorder")
        self._container: av.container.OutputContainer | None = None
        self._stream: av.VideoStream | None = None
        self.finished = False

    def _open(self, width: int, height: int) -> None:
        self._container = av.open(str(self.path), mode="w", format="mp4")
        rate = fractions.Fraction(self.fps).limit_denominator(1001)
        stream = self._container.add_stream("libx264", rate=rate)
        stream.width, stream.height = width - width % 2, height - height % 2
        stream.pix_fmt = "yuv420p"
        stream.options = {"preset": "ultrafast", "tune": "zerolatency", "crf": "20"}
        self._stream = stream
        self.size = (width, height)

    def _encode(self, rgb: np.ndarray | None) -> None:
        if rgb is not None:
            if self._container is None:
                self._open(rgb.shape[1], rgb.shape[0])
            assert self._stream is not None and self._container is not None
            frame = av.VideoFrame.from_ndarray(rgb[: self._stream.height, : self._stream.width], format="rgb24")
            frame.pts = self.frames
            packets = self._stream.encode(frame)
            self._container.mux(packets)
            self.frames += 1
            self.bytes += sum(packet.size for packet in packets)  # the muxer buffers: the file size lags
            if self.max_bytes is not None and self.bytes >= self.max_bytes:
                self.full = True
                self._encode(None)
            return
        if self._container is not None:
            assert self._stream is not None
            self._container.mux(self._stream.encode(None))
            self._container.close()
            self._container = None
        self.finished = True

    async def write(self, rgb: np.ndarray) -> None:
        if self.finished:
            return
        await asyncio.get_running_loop().run_in_executor(self._executor, self._encode, rgb)

    async def finish(self) -> None:
        """Flush the encoder and close the file; idempotent."""
        if not self.finished:
            await asyncio.get_running_loop().run_in_executor(self._executor, self._encode, None)
        self._executor.shutdown(wait=False)
