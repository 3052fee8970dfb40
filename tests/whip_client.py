"""A WHIP publisher as OBS is one, the raw HTTP that it and WHEP players speak (SDP bodies, a Bearer
token), and a controller that asks what a publisher sends."""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp
from aiortc import RTCPeerConnection

from rtc_omni.client.media import COLOURS, ColourVideoTrack, ToneAudioTrack
from rtc_omni.client.rtc_peers import UnderstandClient
from rtc_omni.signaling.ice import rtc_configuration

from .conftest import RunningServer

TOKEN = "s3cret-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
SDP = {"Content-Type": "application/sdp"}


async def http_raw(server: RunningServer, method: str, path: str, **kwargs: Any) -> tuple[int, Any, str]:
    """One request; returns status, headers and body text. `path` may be an absolute URL."""
    url = path if path.startswith("http") else server.url + path
    async with aiohttp.ClientSession() as http:
        async with http.request(method, url, **kwargs) as response:
            return response.status, response.headers, await response.text()


async def publisher_offer(video: bool = True, audio: bool = True) -> tuple[RTCPeerConnection, str]:
    """An aiortc publisher offering what OBS does: sendonly red video and a 440 Hz tone, no DataChannel."""
    pc = RTCPeerConnection(rtc_configuration([]))
    if video:
        pc.addTransceiver(ColourVideoTrack(COLOURS["red"], 320, 240, 30), direction="sendonly")
    if audio:
        pc.addTransceiver(ToneAudioTrack(440.0), direction="sendonly")
    await pc.setLocalDescription(await pc.createOffer())
    return pc, pc.localDescription.sdp


async def ask_about_colour_and_tone(server: RunningServer, session_id: str, token: str) -> None:
    """Attach a controller to the publisher's session (with `token`: the server's, or the session's);
    its answer names the colour and the tone."""
    controller = UnderstandClient(server.url, video=None, audio=None, token=token)
    try:
        await controller.connect(kind="control", session_id=session_id)
        await controller.configure(modalities=["text"])
        await controller.wait_event("video.frame.ack", timeout=10)
        await asyncio.sleep(1.0)  # a second of the tone in the audio buffer
        result = await controller.ask("What do you see and hear?")
        assert "mostly red" in result.text, result.text
        assert "dominant frequency about 440 Hz" in result.text, result.text
    finally:
        await controller.close()
