"""CPU per session of another Python WebRTC server (pipecat's SmallWebRTCTransport) doing the same
ingest plus an audio echo, against rtc-omni's figure from the same run: is aiortc, as rtc-omni uses
it, as cheap as its best-known Python peer?"""

from __future__ import annotations

import asyncio
import subprocess
from pathlib import Path
from typing import Any

from ..client.media import ToneAudioTrack
from ..client.peer import UnderstandClient, prefer_video_codec
from .common import CpuMeter, free_port, stop, wait_healthy
from .understand import camera

PIPECAT = "pipecat-ai[webrtc]==1.14.0"  # as pinned in the [bench] extra
SERVER_SCRIPT = Path(__file__).with_name("pipecat_server.py")


class AudioFirstClient(UnderstandClient):
    """pipecat expects the mic on the first m-line and the camera on the second."""

    def _add_transceivers(self) -> None:
        assert self.audio is not None and self.video is not None
        self.pc.addTransceiver(self.audio, direction="sendrecv")
        prefer_video_codec(self.pc.addTransceiver(self.video, direction="sendonly"), "vp8")


def unavailable(python: str) -> str | None:
    """Why `python` cannot run the peer server, or None."""
    check = subprocess.run(
        [python, "-c", "import pipecat.transports.smallwebrtc.transport"], capture_output=True, text=True
    )
    if check.returncode != 0:
        return f"{PIPECAT} is not importable by {python} (install the [bench] extra or pass --peer-python)"
    return None


async def compare(python: str, seconds: float, rtc_omni_points: list[dict[str, Any]]) -> dict[str, Any]:
    reason = unavailable(python)
    if reason is None and not rtc_omni_points:
        reason = "rtc-omni's one-session capacity figure is missing"
    if reason is not None:
        return {"skipped": reason}
    port = free_port()
    process = subprocess.Popen(
        [python, str(SERVER_SCRIPT), str(port)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    url = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(url + "/healthz", process)
        client = AudioFirstClient(url, video=camera(), audio=ToneAudioTrack())
        try:
            await client.connect(timeout=30)
            await asyncio.sleep(2.0)  # steady state, as for rtc-omni's figure
            meter = CpuMeter([process.pid])
            await asyncio.sleep(seconds)
            cpu = meter.per_second()[0]
            assert client.recorder is not None
            echoed = client.recorder.voiced_frames() > 0
        finally:
            await client.close()
    finally:
        stop(process)
    ours = rtc_omni_points[0]["server_cpu_s_per_s"]
    return {
        "name": "pipecat SmallWebRTCTransport " + PIPECAT.split("==")[1],
        "cpu_s_per_s": round(cpu, 3),
        "echo_heard": echoed,
        "rtc_omni_cpu_s_per_s": ours,
        "ratio": round(cpu / ours, 2) if ours else None,
    }
