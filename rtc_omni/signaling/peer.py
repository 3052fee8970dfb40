"""The WebRTC transport of a session: one RTCPeerConnection bound to one session of either kind.

It turns the `control` DataChannel into `receive_text` calls and events back into JSON text,
drains incoming tracks (into the session when it takes media, media/ingest.py), attaches the
session's outgoing track (talker audio or generated video) to the answer, and closes everything
when the peer goes away or never connects.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections import deque
from collections.abc import Awaitable, Callable
from typing import Any

from aiortc import RTCDataChannel, RTCPeerConnection, RTCSessionDescription
from aiortc.mediastreams import MediaStreamTrack

from ..config import Settings
from ..engines import Engines
from ..media.ingest import discard, start_ingest
from ..media.talker import TalkerAudioTrack
from ..media.video_out import GeneratedVideoTrack
from ..sessions.generate import GenerateSession
from ..sessions.recordings import RecordingStore
from ..sessions.understand import UnderstandSession
from ..tasks import TaskSet
from .ice import ice_servers, rtc_configuration

logger = logging.getLogger(__name__)

CONTROL_LABEL = "control"
MAX_PENDING_EVENTS = 256  # events emitted before the DataChannel opens; the oldest go first
SESSION_KINDS = ("understand", "generate")
CHANNEL_DRAIN_S = 1.0


class OfferRejected(Exception):
    """The offer cannot carry this kind of session."""


class PeerSession:
    """A session of either kind reached over one peer connection."""

    def __init__(
        self,
        session_id: str,
        kind: str,
        settings: Settings,
        engines: Engines,
        on_closed: Callable[[PeerSession], Awaitable[None] | None],
        recordings: RecordingStore | None = None,
    ) -> None:
        self.session_id = session_id
        self.kind = kind
        self.settings = settings
        self.pc = RTCPeerConnection(
            rtc_configuration(ice_servers(settings.ice_server, settings.ice_username, settings.ice_credential))
        )
        self.session: UnderstandSession | GenerateSession
        self.outgoing: TalkerAudioTrack | GeneratedVideoTrack
        if kind == "understand":
            assert engines.understand is not None
            talker = self.outgoing = TalkerAudioTrack()
            self.session = UnderstandSession(
                session_id=session_id,
                settings=settings,
                engine=engines.understand,
                send=self._send,
                talker=talker,
                on_closed=lambda _session: self._close_soon(),
            )
        else:
            assert engines.generate is not None
            video = self.outgoing = GeneratedVideoTrack()
            self.session = GenerateSession(
                session_id=session_id,
                settings=settings,
                engine=engines.generate,
                send=self._send,
                video=video,
                reserve_recording=recordings.reserve if recordings else None,
                on_closed=lambda _session: self._close_soon(),
            )
        self._on_closed = on_closed
        self._channel: RTCDataChannel | None = None
        self._pending: deque[str] = deque(maxlen=MAX_PENDING_EVENTS)
        self._tasks = TaskSet()
        self._closing: asyncio.Task[None] | None = None
        self.closed = asyncio.Event()

    # ----------------------------------------------------------------- setup

    async def accept(self, offer: RTCSessionDescription) -> RTCSessionDescription:
        """Apply the peer's offer and return the complete (non-trickle) answer."""
        self.pc.on("datachannel", self._on_datachannel)
        self.pc.on("track", self._on_track)
        self.pc.on("connectionstatechange", self._on_connection_state)
        await self.pc.setRemoteDescription(offer)
        if any(t.kind == self.outgoing.kind for t in self.pc.getTransceivers()):
            self.pc.addTrack(self.outgoing)
        elif isinstance(self.session, UnderstandSession):
            self.session.talker = None  # no audio m-line: speech only as audio events, if asked for
        else:
            raise OfferRejected("a generate session needs a video m-line to receive the generated video")
        answer = await self.pc.createAnswer()
        await self.pc.setLocalDescription(answer)
        if not _has_candidates(self.pc.localDescription.sdp):
            raise RuntimeError("the server's ICE agent gathered no candidates; check --ice-address and --ice-server")
        self.session.start()
        self._tasks.spawn(self._connect_deadline())
        return self.pc.localDescription

    def _on_datachannel(self, channel: RTCDataChannel) -> None:
        if channel.label != CONTROL_LABEL or self._channel is not None:
            logger.info("session %s: closing unexpected DataChannel %r", self.session_id, channel.label)
            channel.close()
            return
        self._channel = channel

        @channel.on("message")
        def on_message(message: str | bytes) -> None:
            if isinstance(message, str):
                self.session.receive_text(message)
            else:
                self.session.receive_binary(message)

        @channel.on("open")
        def on_open() -> None:
            self._flush_pending()

        self._flush_pending()

    def _on_track(self, track: MediaStreamTrack) -> None:
        if isinstance(self.session, UnderstandSession):
            start_ingest(track, self.session, self._tasks.spawn)
        else:
            self._tasks.spawn(discard(track))  # a generation takes no media, but aiortc's queue must drain

    async def _on_connection_state(self) -> None:
        state = self.pc.connectionState
        logger.info("session %s: connection %s", self.session_id, state)
        if state in ("failed", "closed"):
            self._close_soon()

    async def _connect_deadline(self) -> None:
        await asyncio.sleep(self.settings.ice_connect_timeout)
        if self.pc.connectionState != "connected":
            logger.info(
                "session %s: not connected after %.1f s, closing", self.session_id, self.settings.ice_connect_timeout
            )
            self._close_soon()

    # ----------------------------------------------------------------- events out

    def _send(self, event: dict[str, Any]) -> None:
        self._pending.append(json.dumps(event, separators=(",", ":")))
        self._flush_pending()

    def _flush_pending(self) -> None:
        channel = self._channel
        if channel is None or channel.readyState != "open":
            return
        while self._pending:
            channel.send(self._pending.popleft())

    # ----------------------------------------------------------------- teardown

    def _close_soon(self) -> None:
        if self._closing is None:
            self._closing = asyncio.ensure_future(self.close())

    async def close(self) -> None:
        """Close the session, its tasks, its tracks and the peer connection; idempotent."""
        if self.closed.is_set():
            return
        self.closed.set()
        self._flush_pending()
        await self.session.close()
        await self._drain_channel()
        await self._tasks.cancel_all()
        self.outgoing.stop()
        await self.pc.close()
        result = self._on_closed(self)
        if asyncio.iscoroutine(result):
            await result

    async def _drain_channel(self) -> None:
        """Give the last events (an error, session.done) a moment to leave before the close."""
        channel = self._channel
        deadline = asyncio.get_running_loop().time() + CHANNEL_DRAIN_S
        while channel is not None and channel.readyState == "open" and channel.bufferedAmount > 0:
            if asyncio.get_running_loop().time() > deadline:
                break
            await asyncio.sleep(0.01)

    async def stats(self) -> dict[str, Any]:
        stats = {"session_id": self.session_id, **self.session.stats(), "connection_state": self.pc.connectionState}
        bytes_in = bytes_out = packets_in = 0
        if not self.closed.is_set():
            for report in (await self.pc.getStats()).values():
                if report.type == "transport":
                    bytes_in += report.bytesReceived
                    bytes_out += report.bytesSent
                elif report.type == "inbound-rtp":
                    packets_in += report.packetsReceived
        stats.update(bytes_received=bytes_in, bytes_sent=bytes_out, rtp_packets_received=packets_in)
        if isinstance(self.outgoing, TalkerAudioTrack):
            stats.update(
                talker_buffered_ms=round(self.outgoing.buffered_ms, 1), talker_frames_sent=self.outgoing.frames_sent
            )
        else:
            stats.update(video_backlog_frames=self.outgoing.backlog, video_rebases=self.outgoing.rebases)
        return stats


def _has_candidates(sdp: str) -> bool:
    return "a=candidate:" in sdp
