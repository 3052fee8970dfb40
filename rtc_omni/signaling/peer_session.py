"""The WebRTC transport of a session: peer connections bound to one session of either kind.

`PeerSession` owns the session and the peer connection that created it (a JSON offer or a WHIP
publisher). It turns every `control` DataChannel into `receive_text` calls and fans events back
out as JSON text, drains incoming tracks (into the session when it takes media, media/ingest.py),
serves the session's outgoing track (talker audio or generated video) through one TrackFanout, and
closes everything when the peer goes away or never connects. `AttachedPeer` is a further peer
connection on a running session: a controller (DataChannel plus outgoing media) or a WHEP viewer.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any, ClassVar, Protocol

from aiortc import RTCDataChannel, RTCPeerConnection, RTCRtpTransceiver, RTCSessionDescription
from aiortc.mediastreams import MediaStreamTrack
from aiortc.sdp import SessionDescription

from ..config import Settings
from ..media.fanout import TrackFanout
from ..media.ingest import discard, start_ingest
from ..media.shared_encode import SHARED_CODECS, EncodedTrack, SharedEncoder
from ..media.talker import TalkerAudioTrack
from ..media.video_out import GeneratedVideoTrack
from ..metrics import DATACHANNEL_OVERFLOWS
from ..patches.codecs import negotiated_codecs
from ..patches.datachannel_receive import NOT_UTF8
from ..patches.decoding import decode_audio_on_the_loop
from ..patches.ice_candidates import keep_consent_while
from ..patches.jitter import release_audio_on_arrival, release_frames_when_complete
from ..patches.keyframes import forward_keyframe_requests
from ..sessions.registry import SessionLimitReached, new_session_id
from ..tasks import TaskSet
from .bitrate import limit_video_bitrate
from .dtls import passive_when_offered_actpass
from .factory import Services, create_session
from .ice import advertise_public_addresses, configured_ice_servers, rtc_configuration
from .ptime import talker_packet_ms, with_audio_ptime

logger = logging.getLogger(__name__)

CONTROL_LABEL = "control"
CHANNEL_LABELS = {"realtime": "oai-events"}  # a protocol whose clients name their channel otherwise
MAX_PENDING_EVENTS = 256  # events emitted before any DataChannel opens; the oldest go first
MAX_ATTACHED_PEERS = 16  # controllers and viewers per session
CHANNEL_DRAIN_S = 1.0
# Events queued inside aiortc for one DataChannel. aiortc queues without bound while the peer does
# not acknowledge; a peer whose next event would take it past this is closed, as a WebSocket client
# is (websocket.Outbox). It also caps one event for a peer that allows any message size.
MAX_CHANNEL_BUFFERED_BYTES = 1024 * 1024


class OfferRejected(Exception):
    """The offer cannot carry this kind of session."""


OFFER_FAILURES = (OfferRejected, ValueError, RuntimeError)  # what accepting an unusable offer raises


@asynccontextmanager
async def closed_on_failure(link: _PeerLink) -> AsyncIterator[None]:
    """Close `link` if accepting its offer fails in any way, even by a cancelled request.

    aiortc raises assorted errors (AttributeError, KeyError ...) deep inside on offers it cannot
    use: anything but OFFER_FAILURES becomes OfferRejected (a 400), logged with its traceback.
    """
    try:
        yield
    except BaseException as exc:
        await asyncio.shield(link.close())
        if isinstance(exc, Exception) and not isinstance(exc, OFFER_FAILURES):
            logger.warning("%s: accepting the offer failed unexpectedly", link.name, exc_info=exc)
            raise OfferRejected(f"{type(exc).__name__}: {exc}") from exc
        raise


class TooManyPeers(SessionLimitReached):
    """The session already has MAX_ATTACHED_PEERS controllers and viewers."""


class ControlReceiver(Protocol):
    """What a `control` DataChannel feeds: a session of any kind."""

    kind: ClassVar[str]

    def receive_text(self, raw: str) -> None: ...

    def receive_binary(self, data: bytes) -> None: ...

    def receive_undecodable_text(self) -> None: ...

    def event_dropped(self, size: int) -> None:
        """An event of `size` bytes was too large for a DataChannel: the session says so, in its
        protocol's `error` shape."""
        ...

    def channel_opened(self) -> None: ...


class ControlChannels:
    """The `control` DataChannels bound to one session; events fan out to every open one.

    Until one is open, events wait in a bounded queue (the oldest dropped) and go to the first
    channel that opens: a WHIP publisher has no channel, so its controller gets what came before.
    An event that would leave more than MAX_CHANNEL_BUFFERED_BYTES unsent on a channel is not
    queued there: the channel gets no more, and its `on_overflow` runs.
    """

    def __init__(self) -> None:
        self._channels: list[RTCDataChannel] = []
        self._pending: deque[str] = deque(maxlen=MAX_PENDING_EVENTS)
        self._overflow: dict[RTCDataChannel, Callable[[], None]] = {}
        self._receivers: dict[RTCDataChannel, ControlReceiver] = {}

    def attach(self, channel: RTCDataChannel, receiver: ControlReceiver, on_overflow: Callable[[], None]) -> None:
        self._channels.append(channel)
        self._overflow[channel] = on_overflow
        self._receivers[channel] = receiver

        @channel.on("message")
        def on_message(message: str | bytes) -> None:
            if isinstance(message, str):
                receiver.receive_text(message)
            else:
                receiver.receive_binary(message)

        @channel.on(NOT_UTF8)
        def on_not_utf8(_size: int) -> None:
            receiver.receive_undecodable_text()

        @channel.on("open")
        def on_open() -> None:
            self._flush()

        @channel.on("close")
        def on_close() -> None:
            self._detach(channel)

        self._flush()

    def send(self, event: dict[str, Any]) -> None:
        self._pending.append(json.dumps(event, separators=(",", ":")))
        self._flush()

    def _detach(self, channel: RTCDataChannel) -> Callable[[], None] | None:
        if channel in self._channels:
            self._channels.remove(channel)
        self._receivers.pop(channel, None)
        return self._overflow.pop(channel, None)

    def _flush(self) -> None:
        open_channels = [c for c in self._channels if c.readyState == "open"]
        while open_channels and self._pending:
            text = self._pending.popleft()
            open_channels = [c for c in open_channels if self._send_within_bound(c, text)]

    def _send_within_bound(self, channel: RTCDataChannel, text: str) -> bool:
        """Queue `text` on `channel` if its unsent bytes stay within the bound; False when the
        channel overflowed instead and was given up."""
        size = len(text)  # json.dumps escapes all but ASCII: one byte per character
        if size > MAX_CHANNEL_BUFFERED_BYTES:  # even where the peer allows any message size
            self._drop_oversized(channel, size)
            return True
        if channel.bufferedAmount + size > MAX_CHANNEL_BUFFERED_BYTES:
            self._overflowed(channel)
            return False
        try:
            channel.send(text)
        except ValueError:  # over the peer's SCTP max-message-size (256 KiB in browsers and aiortc)
            self._drop_oversized(channel, size)
        return True

    def _drop_oversized(self, channel: RTCDataChannel, size: int) -> None:
        """In place of an event too large to send: the session's short `error` saying it was dropped."""
        logger.warning("dropping a %d-byte event: larger than the DataChannel carries", size)
        receiver = self._receivers.get(channel)
        if receiver is not None:
            receiver.event_dropped(size)

    def _overflowed(self, channel: RTCDataChannel) -> None:
        logger.warning("DataChannel peer takes no events (%d bytes unsent); closing it", channel.bufferedAmount)
        DATACHANNEL_OVERFLOWS.inc()
        on_overflow = self._detach(channel)
        if on_overflow is not None:
            on_overflow()

    async def drain(self, timeout: float) -> None:
        """Give the last events (an error, session.done) a moment to leave before the close."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while any(c.readyState == "open" and c.bufferedAmount > 0 for c in self._channels):
            if loop.time() > deadline:
                break
            await asyncio.sleep(0.01)


class _PeerLink:
    """One server-side RTCPeerConnection: answers with all its candidates, and closes when the peer
    fails, leaves, or does not connect within --ice-connect-timeout."""

    def __init__(self, name: str, settings: Settings) -> None:
        self.name = name
        self.settings = settings
        self.pc = RTCPeerConnection(rtc_configuration(configured_ice_servers(settings)))
        self.pc.on("connectionstatechange", self._on_connection_state)
        self.pc.on("datachannel", self._on_datachannel)
        self._has_channel = False
        self._tasks = TaskSet()
        self._closing: asyncio.Task[None] | None = None
        self.closed = asyncio.Event()

    async def _answer(self) -> RTCSessionDescription:
        answer = await self.pc.createAnswer()
        await self.pc.setLocalDescription(passive_when_offered_actpass(self.pc.remoteDescription, answer))
        sdp = self.pc.localDescription.sdp
        if "a=candidate:" not in sdp:
            raise RuntimeError("the server's ICE agent gathered no candidates; check --ice-address and --ice-server")
        self._tasks.spawn(self._connect_deadline())
        sdp = with_audio_ptime(advertise_public_addresses(sdp, self.settings.ice_public_address))
        # Last: aiortc's SDP objects, which the steps above go through, drop b= lines.
        return RTCSessionDescription(limit_video_bitrate(self.pc, sdp, self.settings.max_video_bitrate), "answer")

    def _control(self) -> tuple[ControlChannels, ControlReceiver] | None:
        """Where this connection's `control` DataChannel is bound (None: it may not control)."""
        raise NotImplementedError

    def _on_datachannel(self, channel: RTCDataChannel) -> None:
        bound = self._control()
        if bound is None:
            logger.info("%s: closing DataChannel %r: this peer only watches", self.name, channel.label)
            channel.close()
            return
        channels, receiver = bound
        if channel.label != CHANNEL_LABELS.get(receiver.kind, CONTROL_LABEL) or self._has_channel:
            logger.info("%s: closing unexpected DataChannel %r", self.name, channel.label)
            channel.close()
            return
        self._has_channel = True
        channels.attach(channel, receiver, self._close_soon)
        receiver.channel_opened()  # aiortc announces a remote channel once it is open

    def _offers(self, kind: str) -> bool:
        return any(t.kind == kind for t in self.pc.getTransceivers())

    async def _on_connection_state(self) -> None:
        state = self.pc.connectionState
        logger.info("%s: connection %s", self.name, state)
        if state in ("failed", "closed"):
            self._close_soon()

    async def _connect_deadline(self) -> None:
        await asyncio.sleep(self.settings.ice_connect_timeout)
        if self.pc.connectionState != "connected":
            logger.info("%s: not connected after %.1f s, closing", self.name, self.settings.ice_connect_timeout)
            self._close_soon()

    def _close_soon(self) -> None:
        if self._closing is None:
            self._closing = asyncio.ensure_future(self.close())

    async def close(self) -> None:
        raise NotImplementedError


class PeerSession(_PeerLink):
    """A session of any kind and the peer connection that created it; it carries the session's
    events on its `control` channels and its speech or video on one outgoing track.

    `ingest_only` (a WHIP publisher): the answer is recvonly, an understanding session takes media
    at once with the default config, and control and outgoing media reach only attached peers.
    """

    def __init__(
        self,
        session_id: str,
        kind: str,
        services: Services,
        on_closed: Callable[[PeerSession], Awaitable[None] | None],
        ingest_only: bool = False,
        realtime_config: dict[str, Any] | None = None,
    ) -> None:
        super().__init__(f"session {session_id}", services.settings)
        self.session_id = session_id
        self.kind = kind
        self.ingest_only = ingest_only
        self.channels = ControlChannels()
        self.outgoing: TalkerAudioTrack | GeneratedVideoTrack
        self.session = create_session(
            kind,
            session_id,
            services,
            self,
            publisher=ingest_only,
            on_closed=self._close_soon,
            realtime_config=realtime_config,
        )
        self._on_closed = on_closed
        self._last_rtp_at = time.monotonic()
        self._fanout = TrackFanout(self.outgoing)
        self._encoders: dict[str, SharedEncoder] = {}  # by codec MIME type, while they have viewers
        self.attached: set[AttachedPeer] = set()

    # ----------------------------------------------------------------- the session's carrier

    def send(self, event: dict[str, Any]) -> None:
        self.channels.send(event)

    def talker(self) -> TalkerAudioTrack:
        self.outgoing = talker = TalkerAudioTrack()
        return talker

    def video(self) -> GeneratedVideoTrack:
        self.outgoing = video = GeneratedVideoTrack()
        return video

    # ----------------------------------------------------------------- setup

    async def accept(self, offer: RTCSessionDescription) -> RTCSessionDescription:
        """Apply the peer's offer and return the complete (non-trickle) answer."""
        self.pc.on("track", self._on_track)
        await self.pc.setRemoteDescription(offer)
        release_frames_when_complete(self.pc)
        release_audio_on_arrival(self.pc)
        decode_audio_on_the_loop(self.pc)
        if isinstance(self.outgoing, TalkerAudioTrack):
            self.outgoing.packet_ms = talker_packet_ms(offer.sdp, self.settings.talker_packet_ms)
        media = self.outgoing.kind
        if self.ingest_only:
            pass  # a publisher receives nothing: attached peers take the output
        elif self._offers(media):
            self.pc.addTrack(self.subscribe_outgoing())
        elif not self.session.drop_output():
            raise OfferRejected(f"a {self.kind} session needs a {media} m-line to receive the generated {media}")
        answer = await self._answer()
        if self.ingest_only:
            keep_consent_while(self.pc, self._publisher_media_arriving)
        if _sends_media(offer.sdp):  # a pure viewer sends nothing steadily: aiortc's consent checks cover it
            self._tasks.spawn(self._watch_liveness())
        self.session.start()
        return answer

    def _publisher_media_arriving(self) -> bool:
        return time.monotonic() - self._last_rtp_at < self.settings.publisher_media_timeout

    async def _watch_liveness(self) -> None:
        """End the session of a peer that went away without a goodbye.

        A WHIP publisher must keep its RTP coming (FFmpeg answers no ICE consent checks, so media is
        its only sign of life: consent is kept while it arrives, patches.ice.keep_consent_while). Any other
        peer must keep sending something (media, RTCP reports, DataChannel traffic) within
        --peer-silence-timeout, well before aiortc's own consent checks would give up (~30 s).
        """
        publisher = self.ingest_only
        timeout = self.settings.publisher_media_timeout if publisher else self.settings.peer_silence_timeout
        seen = 0
        while True:
            await asyncio.sleep(min(1.0, timeout / 4))
            bytes_in, _, rtp_packets = await self._transport_counters()
            received = rtp_packets if publisher else bytes_in
            if received > seen or self.pc.connectionState != "connected":  # the connect deadline covers setup
                seen, self._last_rtp_at = received, time.monotonic()
            elif time.monotonic() - self._last_rtp_at >= timeout:
                what = "RTP from the publisher" if publisher else "packets from the peer"
                logger.info("%s: no %s for %.1f s, closing", self.name, what, timeout)
                self._close_soon()
                return

    def subscribe_outgoing(self) -> MediaStreamTrack:
        """A consumer's view of the outgoing track; every consumer gets every frame (media/fanout.py)."""
        return self._fanout.subscribe()

    def subscribe_encoded(self, mime_type: str) -> EncodedTrack:
        """The outgoing track encoded for `mime_type`, one encode shared by all its subscribers."""
        encoder = self._encoders.get(mime_type)
        if encoder is None:
            forget = lambda: self._encoders.pop(mime_type, None)  # noqa: E731
            encoder = self._encoders[mime_type] = SharedEncoder(self.subscribe_outgoing(), mime_type, forget)
        return encoder.subscribe()

    @property
    def has_outgoing(self) -> bool:
        """False for an understanding session whose peer offered no audio (it has no talker)."""
        return self.session.has_output

    async def attach(
        self, offer: RTCSessionDescription, name: str, controls: bool = True
    ) -> tuple[AttachedPeer, RTCSessionDescription]:
        """Answer a further peer on this session (a controller, or a viewer: `controls=False`); see
        AttachedPeer."""
        if len(self.attached) >= MAX_ATTACHED_PEERS:
            raise TooManyPeers(f"session already has {MAX_ATTACHED_PEERS} attached peers")
        peer = AttachedPeer(self, name, controls)
        self.attached.add(peer)
        async with closed_on_failure(peer):
            answer = await peer.accept(offer)
        return peer, answer

    def find_attached(self, resource_id: str) -> AttachedPeer | None:
        return next((p for p in self.attached if p.resource_id == resource_id), None)

    def _control(self) -> tuple[ControlChannels, ControlReceiver]:
        return self.channels, self.session

    def _on_track(self, track: MediaStreamTrack) -> None:
        sink = self.session.media_sink
        if sink is not None:
            start_ingest(track, sink, self._tasks.spawn, self.settings.max_image_pixels)
        else:
            self._tasks.spawn(discard(track))  # a generation takes no media, but aiortc's queue must drain

    # ----------------------------------------------------------------- teardown

    async def close(self) -> None:
        """Close the session, attached peers, tasks, tracks and the peer connection; idempotent."""
        if self.closed.is_set():
            return
        self.closed.set()
        await self.session.close()
        await self.channels.drain(CHANNEL_DRAIN_S)
        await asyncio.gather(*(peer.close() for peer in list(self.attached)))
        for encoder in list(self._encoders.values()):
            encoder.stop()
        await self._tasks.cancel_all()
        self.outgoing.stop()
        self._fanout.stop()
        await self.pc.close()
        result = self._on_closed(self)
        if asyncio.iscoroutine(result):
            await result

    async def _transport_counters(self) -> tuple[int, int, int]:
        """Bytes received, bytes sent and RTP packets received on the peer connection."""
        bytes_in = bytes_out = packets_in = 0
        if not self.closed.is_set():
            for report in (await self.pc.getStats()).values():
                if report.type == "transport":
                    bytes_in += report.bytesReceived
                    bytes_out += report.bytesSent
                elif report.type == "inbound-rtp":
                    packets_in += report.packetsReceived
        return bytes_in, bytes_out, packets_in

    async def stats(self) -> dict[str, Any]:
        stats = {"session_id": self.session_id, **self.session.stats(), "connection_state": self.pc.connectionState}
        bytes_in, bytes_out, packets_in = await self._transport_counters()
        stats.update(
            bytes_received=bytes_in,
            bytes_sent=bytes_out,
            rtp_packets_received=packets_in,
            attached_peers=len(self.attached),
            shared_encoders={mime: e.subscribers for mime, e in self._encoders.items()},
        )
        if isinstance(self.outgoing, TalkerAudioTrack):
            stats.update(
                talker_buffered_ms=round(self.outgoing.buffered_ms, 1),
                talker_packets_sent=self.outgoing.packets_sent,
                talker_voiced_ms_sent=self.outgoing.voiced_ms_sent,
            )
        else:
            stats.update(video_backlog_frames=self.outgoing.backlog, video_rebases=self.outgoing.rebases)
        return stats


def _negotiated_mime_type(transceiver: RTCRtpTransceiver) -> str:
    """The codec this transceiver's sender will use: aiortc sends with the first negotiated one."""
    mime_types = [c.mimeType.lower() for c in negotiated_codecs(transceiver)]
    if not mime_types or mime_types[0] not in SHARED_CODECS:
        raise OfferRejected(f"{transceiver.kind}: offer one of {', '.join(SHARED_CODECS)}, not {mime_types}")
    return mime_types[0]


class AttachedPeer(_PeerLink):
    """A further peer connection on a running session.

    A `control` DataChannel it opens is bound to the session (commands in, events fanned out),
    unless it only watches (`controls` False: a WHEP viewer), whose DataChannels are closed;
    if it offers to receive the session's outgoing media kind, it gets that track encoded once
    for all attached peers using the same codec (media/shared_encode.py). Media it sends is
    drained and ignored. It ends with its own connection or with the session.
    """

    def __init__(self, owner: PeerSession, name: str, controls: bool = True) -> None:
        super().__init__(f"{name} of session {owner.session_id}", owner.settings)
        self.owner = owner
        self.controls = controls
        self.resource_id = new_session_id()  # a WHEP viewer's resource URL
        self._track: EncodedTrack | None = None

    async def accept(self, offer: RTCSessionDescription) -> RTCSessionDescription:
        self.pc.on("track", lambda track: self._tasks.spawn(discard(track)))
        await self.pc.setRemoteDescription(offer)
        kind = self.owner.outgoing.kind
        transceiver = next((t for t in self.pc.getTransceivers() if t.kind == kind), None)
        if self.owner.has_outgoing and transceiver is not None:
            self._track = self.owner.subscribe_encoded(_negotiated_mime_type(transceiver))
            forward_keyframe_requests(self.pc.addTrack(self._track), self._track.request_keyframe)
        return await self._answer()

    def _control(self) -> tuple[ControlChannels, ControlReceiver] | None:
        return (self.owner.channels, self.owner.session) if self.controls else None

    async def close(self) -> None:
        if self.closed.is_set():
            return
        self.closed.set()
        self.owner.attached.discard(self)
        await self._tasks.cancel_all()
        if self._track is not None:
            self._track.stop()
        await self.pc.close()


def _sends_media(sdp: str) -> bool:
    """Whether the offer's peer sends audio or video (a camera, a microphone, a publisher)."""
    return any(
        m.kind in ("audio", "video") and m.direction in ("sendonly", "sendrecv")
        for m in SessionDescription.parse(sdp).media
    )
