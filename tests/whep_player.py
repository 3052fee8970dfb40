"""A WHEP player (aiortc, recvonly), as the tests watch a session's video or hear its talker."""

from __future__ import annotations

from typing import Any

from aiortc import RTCPeerConnection, RTCRtpReceiver, RTCSessionDescription
from aiortc.mediastreams import MediaStreamTrack

from rtc_omni.client.media import AudioRecorder, VideoReceiver
from rtc_omni.client.rtc_peers import ControlClient
from rtc_omni.signaling.ice import rtc_configuration

from .conftest import RunningServer
from .waiting import wait_until
from .whip_client import SDP, http_raw


def viewing(client: ControlClient) -> dict[str, str]:
    """The headers of a WHEP player given the client's view token (the view URL's capability)."""
    return {"Authorization": f"Bearer {client.view_token}"}


class WhepPlayer:
    """A WHEP player: a recvonly offer POSTed as application/sdp, the answer applied."""

    def __init__(self, kind: str, codec: str | None = None) -> None:
        self.pc = RTCPeerConnection(rtc_configuration([]))
        transceiver = self.pc.addTransceiver(kind, direction="recvonly")
        if codec is not None:
            capabilities = RTCRtpReceiver.getCapabilities(kind)
            assert capabilities is not None
            transceiver.setCodecPreferences([c for c in capabilities.codecs if c.mimeType.lower() == codec])
        self.video: VideoReceiver | None = None
        self.audio: AudioRecorder | None = None
        self.location = ""
        self.pc.on("track", self._on_track)

    def _on_track(self, track: MediaStreamTrack) -> None:
        if track.kind == "video":
            self.video = VideoReceiver(track)
        else:
            self.audio = AudioRecorder(track)

    async def offer(self) -> str:
        await self.pc.setLocalDescription(await self.pc.createOffer())
        return self.pc.localDescription.sdp

    async def play(self, server: RunningServer, session_id: str, headers: dict[str, str] | None = None) -> Any:
        """POST the offer; on 201 apply the answer and wait until connected. Returns the headers."""
        status, response_headers, body = await http_raw(
            server, "POST", f"/whep/{session_id}", data=await self.offer(), headers={**SDP, **(headers or {})}
        )
        assert status == 201, body
        assert "a=sendonly" in body and response_headers["ETag"].startswith('"')
        self.location = response_headers["Location"]
        await self.pc.setRemoteDescription(RTCSessionDescription(sdp=body, type="answer"))
        await wait_until(lambda: self.pc.connectionState == "connected")
        return response_headers

    async def close(self) -> None:
        for receiver in (self.video, self.audio):
            if receiver is not None:
                await receiver.stop()
        await self.pc.close()
