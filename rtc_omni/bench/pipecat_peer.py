"""CPU per session of another Python WebRTC server (pipecat's SmallWebRTCTransport) fed by the same
replayed peers, doing the same ingest plus an audio echo: is aiortc, as rtc-omni uses it, as cheap
as its best-known Python peer?"""

from __future__ import annotations

import asyncio
import json
import subprocess
import urllib.request
from pathlib import Path
from typing import Any

from ..client.rtc_peers import MediaClient, prefer_video_codec
from .capacity import SAMPLE_FPS, WARM_UP_S, server_meter
from .common import free_port, stop, wait_healthy
from .replay import replaying_client

PIPECAT = "pipecat-ai[webrtc]==1.14.0"  # as pinned in the [bench] extra
SERVER_SCRIPT = Path(__file__).with_name("pipecat_server.py")


class AudioFirstClient(MediaClient):
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


async def measure(python: str, sessions: int, seconds: float) -> dict[str, Any]:
    """`sessions` replayed peers against one pipecat server: its CPU-seconds per second, and how
    many peers heard their mic echoed back (the pipeline ran for each)."""
    port = free_port()
    process = subprocess.Popen(
        [python, str(SERVER_SCRIPT), str(port), str(SAMPLE_FPS)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    url = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(url + "/healthz", process)
        with urllib.request.urlopen(url + "/healthz", timeout=5) as response:
            event_loop = json.load(response).get("event_loop", "asyncio")
        clients = [replaying_client(url, client_class=AudioFirstClient) for _ in range(sessions)]
        try:
            for client in clients:
                await client.connect(timeout=30)
            await asyncio.sleep(WARM_UP_S)  # steady state, as for rtc-omni's figure
            meter = server_meter(process.pid)
            await asyncio.sleep(seconds)
            *server_cpu, client_cpu = meter.per_second()
            echoed = sum(1 for c in clients if c.recorder is not None and c.recorder.voiced_frames() > 0)
        finally:
            await asyncio.gather(*(c.close() for c in clients))
    finally:
        stop(process)
    return {
        "sessions": sessions,
        "server_cpu_s_per_s": round(sum(server_cpu), 3),
        "server_cpu_s_per_s_per_session": round(sum(server_cpu) / sessions, 3),
        "client_cpu_s_per_s": round(client_cpu, 3),
        "echo_heard": echoed,
        "event_loop": event_loop,
    }
