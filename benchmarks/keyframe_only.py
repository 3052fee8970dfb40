"""Server CPU and bandwidth of decoding only keyframes, asked for by PLI at the sampling rate.

The idea (issue 17): a sender that ignores maxFramerate, b=AS and REMB still answers PLI with a
keyframe, so the server could ask for one keyframe per sample (every 1 / sample_fps s), decode
only those, and drop every delta frame undecoded. This compares, for one aiortc camera
(640x480, moving test pattern, 30 fps, VP8 or H.264) sent to a receiver in this process:

- `every frame`: what the server does: decode every frame, convert the ones due at sample_fps;
- `keyframes + PLI`: PLI every 1 / sample_fps s, delta frames dropped before the decoder;
- `every frame, 5 fps`: the sender itself capped as our clients now do (camera_send_fps).

It prints the receiving process's CPU (the event loop's RTP work plus aiortc's decoder thread),
the bitrate received, and frames decoded and sampled per second. The sender runs in a child
process so its encoder's CPU is not counted. Figures: docs/protocol.md ("Camera frame rate").
It pokes at aiortc internals (the receiver's decoder queue, its PLI method): a benchmark, not a patch.
Run inside the loopback namespace: python -m benchmarks.keyframe_only [SECONDS] [vp8|h264]
"""

from __future__ import annotations

import asyncio
import multiprocessing
import multiprocessing.connection
import queue
import sys
import time
from typing import Any

from aiortc import RTCPeerConnection, RTCRtpReceiver, RTCSessionDescription

from rtc_omni import patches
from rtc_omni.client.media import ColourVideoTrack, camera_send_fps
from rtc_omni.client.rtc_peers import prefer_video_codec
from rtc_omni.media.images import fit_frame, frame_to_jpeg
from rtc_omni.media.ingest import FrameSampler, iter_frames
from rtc_omni.signaling.ice import rtc_configuration

SAMPLE_FPS = 2.0
WARMUP_S = 3.0
MAX_PIXELS = 1920 * 1080


def is_keyframe(mime_type: str, data: bytes) -> bool:
    """Whether an encoded frame decodes on its own: a VP8 key frame, an H.264 IDR access unit."""
    if mime_type.lower() == "video/vp8":
        return bool(data) and not data[0] & 0x01  # the inverse key-frame flag of the frame tag
    start = 0
    while (found := data.find(b"\x00\x00\x01", start)) != -1 and found + 3 < len(data):
        if data[found + 3] & 0x1F == 5:
            return True
        start = found + 3
    return False


class KeyframesOnly(queue.Queue):  # type: ignore[type-arg]
    """aiortc's decoder input, keeping keyframes only (and the None that stops the decoder)."""

    def __init__(self) -> None:
        super().__init__()
        self.dropped = 0

    def put(self, item: Any, block: bool = True, timeout: float | None = None) -> None:
        if item is not None and not is_keyframe(item[0].mimeType, item[1].data):
            self.dropped += 1
            return
        super().put(item, block, timeout)


def run_sender(conn: multiprocessing.connection.Connection, codec: str, fps: int) -> None:
    """The camera, in its own process: answer the receiver's offer, send until told to stop."""

    async def main() -> None:
        patches.apply()
        pc = RTCPeerConnection(rtc_configuration([]))
        transceiver = pc.addTransceiver(ColourVideoTrack((40, 90, 200), 640, 480, fps, moving=True), "sendonly")
        prefer_video_codec(transceiver, codec)
        await pc.setLocalDescription(await pc.createOffer())
        conn.send(pc.localDescription.sdp)
        await pc.setRemoteDescription(RTCSessionDescription(conn.recv(), "answer"))
        await asyncio.get_running_loop().run_in_executor(None, conn.recv)  # "stop"
        await pc.close()

    asyncio.run(main())


async def send_pli(receiver: RTCRtpReceiver, interval: float) -> None:
    while True:
        await asyncio.sleep(interval)
        for source in receiver.getSynchronizationSources():
            await receiver._send_rtcp_pli(source.source)


async def measure(mode: str, codec: str, seconds: float) -> dict[str, float]:
    keyframes = mode == "keyframes + PLI"
    fps = int(camera_send_fps(SAMPLE_FPS)) if mode == "every frame, 5 fps" else 30
    conn, child_conn = multiprocessing.Pipe()
    sender = multiprocessing.get_context("spawn").Process(target=run_sender, args=(child_conn, codec, fps))
    sender.start()
    pc = RTCPeerConnection(rtc_configuration([]))
    counts = {"decoded": 0, "sampled": 0}
    tasks: list[asyncio.Task[Any]] = []

    async def drain(track: Any) -> None:
        sampler = FrameSampler()
        async for frame in iter_frames(track):
            counts["decoded"] += 1
            if keyframes or sampler.take(float(frame.pts * frame.time_base), SAMPLE_FPS):
                await asyncio.to_thread(lambda f=frame: frame_to_jpeg(fit_frame(f, MAX_PIXELS), 90))
                counts["sampled"] += 1

    pc.on("track", lambda track: tasks.append(asyncio.ensure_future(drain(track))))
    try:
        offer = await asyncio.get_running_loop().run_in_executor(None, conn.recv)
        await pc.setRemoteDescription(RTCSessionDescription(offer, "offer"))
        receiver = pc.getTransceivers()[0].receiver
        if keyframes:
            receiver._RTCRtpReceiver__decoder_queue = KeyframesOnly()  # type: ignore[attr-defined]
            tasks.append(asyncio.ensure_future(send_pli(receiver, 1.0 / SAMPLE_FPS)))
        await pc.setLocalDescription(await pc.createAnswer())
        conn.send(pc.localDescription.sdp)
        await asyncio.sleep(WARMUP_S)
        before = (time.process_time(), await received_bytes(pc), dict(counts))
        await asyncio.sleep(seconds)
        cpu, bytes_in = time.process_time() - before[0], await received_bytes(pc) - before[1]
        return {
            "cpu_s_per_s": cpu / seconds,
            "kbit_per_s": bytes_in * 8 / 1000 / seconds,
            "decoded_fps": (counts["decoded"] - before[2]["decoded"]) / seconds,
            "sampled_fps": (counts["sampled"] - before[2]["sampled"]) / seconds,
        }
    finally:
        conn.send("stop")
        for task in tasks:
            task.cancel()
        await pc.close()
        sender.join(10)


async def received_bytes(pc: RTCPeerConnection) -> int:
    return sum(r.bytesReceived for r in (await pc.getStats()).values() if r.type == "transport")


def main() -> None:
    seconds = float(sys.argv[1]) if len(sys.argv) > 1 else 10.0
    codec = sys.argv[2] if len(sys.argv) > 2 else "vp8"
    patches.apply()
    print(f"aiortc camera 640x480 moving, {codec}, server sampling {SAMPLE_FPS:g} fps, {seconds:g} s per mode")
    for mode in ("every frame", "keyframes + PLI", "every frame, 5 fps"):
        figures = asyncio.run(measure(mode, codec, seconds))
        print(
            f"{mode:20} receiver CPU {figures['cpu_s_per_s']:.3f} CPU-s/s, {figures['kbit_per_s']:6.0f} kb/s, "
            f"decoded {figures['decoded_fps']:4.1f} fps, sampled {figures['sampled_fps']:.1f} fps"
        )


if __name__ == "__main__":
    main()
