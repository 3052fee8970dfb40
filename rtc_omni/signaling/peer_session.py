"""The WebRTC transport of a session: peer connections bound to one session of either kind.

`PeerSession` owns the session and its primary link: the peer connection that created it (a JSON
offer or a WHIP publisher), or the one that resumed it since. It turns every `control` DataChannel
into `receive_text` calls and fans events back out as JSON text, drains incoming tracks (into the
session when it takes media, media/ingest.py), and serves the session's outgoing track (talker
audio or generated video) through one TrackFanout, each link its own subscription.

A session ends when its peer says goodbye (a DTLS close, DELETE, a hang-up, `session.close`) or its
first link never connects. A link lost otherwise (ICE failed, the peer went silent, its DataChannel
overflowed) only detaches it, with --resume-grace: the talker parks, rewound to what the peer may
not have heard, events are journaled (sessions/journal.py), and a new peer connection presenting
the resume token (`resume`) takes the session over, or it ends when the grace runs out. A resume
while the old link is up replaces it: the old channel is told `session.replaced` and closed.
`AttachedPeer` is a further peer connection on a running session: a controller (DataChannel plus
outgoing media) or a WHEP viewer; it is not resumed.
"""

from __future__ import annotations

import asyncio
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
from ..sessions.journal import (
    INVALID_RESUME_TOKEN,
    RESUME_CONFLICT,
    RESUME_EXPIRED,
    Resumable,
    ResumeRefused,
    dumps,
    envelope,
    resumable_session,
)
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
MAX_REPLAY_BYTES = MAX_CHANNEL_BUFFERED_BYTES // 2  # a replay goes at once: more is a gap (resync)
# While the talker speaks, a peer that sends media and went this long without a packet is probably
# gone: the talker parks (rewound), so that what it says meanwhile is not lost before the detach.
SUSPECT_SILENCE_S = 2.0
SPEAKING_POLL_S = 0.5  # how often the liveness of a peer is looked at while the talker speaks
JITTER_MARGIN_S = 0.5  # what a peer's jitter buffer still held when its link was lost: played again


class OfferRejected(Exception):
    """The offer cannot carry this kind of session."""


OFFER_FAILURES = (OfferRejected, ValueError, RuntimeError)  # what accepting an unusable offer raises


class _Closable(Protocol):
    name: str

    async def close(self) -> None: ...


@asynccontextmanager
async def closed_on_failure(link: _Closable) -> AsyncIterator[None]:
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

    With `resumable`, every event is numbered and journaled as it is sent (`Resumable.stamp`), the
    resume envelope messages (`session.event_ack`, `.heartbeat`, `.close`) are answered here and never
    reach the session, and a resumed link's channel gets what `Resumable.resume` returned before any
    live event (`begin_resume`).
    """

    def __init__(self, resumable: Resumable | None, on_close_request: Callable[[], None]) -> None:
        self.resumable = resumable
        self._on_close_request = on_close_request  # the client sent session.close
        self._channels: list[RTCDataChannel] = []
        self._pending: deque[str] = deque(maxlen=MAX_PENDING_EVENTS)
        self._primary: RTCDataChannel | None = None  # the session's own link's channel
        self._replay: list[str] | None = None  # what a resumed link's channel gets first, in order
        self._overflow: dict[RTCDataChannel, Callable[[], None]] = {}
        self._receivers: dict[RTCDataChannel, ControlReceiver] = {}

    def attach(
        self,
        channel: RTCDataChannel,
        receiver: ControlReceiver,
        on_overflow: Callable[[], None],
        resumed: bool = False,
        primary: bool = False,
    ) -> None:
        """Bind `channel` (open: aiortc announces a remote channel once it is); `resumed`: the channel
        of the link that resumed the session, which gets the replay first; `primary`: the session's own
        link's (not an attached controller's), whose acks alone free the journal."""
        if primary:
            self._primary = channel
        self._channels.append(channel)
        self._overflow[channel] = on_overflow
        self._receivers[channel] = receiver

        @channel.on("message")
        def on_message(message: str | bytes) -> None:
            if channel not in self._receivers:  # released: a replaced peer controls nothing
                return
            if isinstance(message, str):
                if not self._answered_envelope(channel, message):
                    receiver.receive_text(message)
            else:
                receiver.receive_binary(message)

        @channel.on(NOT_UTF8)
        def on_not_utf8(_size: int) -> None:
            if channel in self._receivers:
                receiver.receive_undecodable_text()

        @channel.on("open")
        def on_open() -> None:
            self._flush()

        @channel.on("close")
        def on_close() -> None:
            self._detach(channel)

        if resumed:
            self._send_replay(channel)
        self._flush()

    def send(self, event: dict[str, Any]) -> None:
        text = self.resumable.stamp(event) if self.resumable is not None else dumps(event)
        if self._replay is not None:
            self._replay.append(text)
        self._pending.append(text)
        self._flush()

    def begin_resume(self, replay: list[str]) -> None:
        """A resume was granted: the resumed link's channel gets `replay` and then every event from
        now on; what waited for a channel is in the replay, or was journaled before it."""
        self._pending.clear()
        self._replay = list(replay)

    def end_replay(self) -> None:
        """The resumed link was lost before its channel opened: the next resume replays afresh."""
        self._replay = None

    def _send_replay(self, channel: RTCDataChannel) -> None:
        replay, self._replay = self._replay or [], None
        self._pending.clear()  # each of these is in the replay too
        for text in replay:
            if not self._send_within_bound(channel, text):
                return

    def release(self, channel: RTCDataChannel | None, last_word: str | None = None) -> None:
        """Send `channel` no more events (its link was lost or replaced), after `last_word` if given."""
        if channel is None:
            return
        self._detach(channel)
        if last_word is not None and channel.readyState == "open":
            channel.send(last_word)

    def _answered_envelope(self, channel: RTCDataChannel, message: str) -> bool:
        """Whether `message` was a resume envelope, answered here (never the session's to decode)."""
        if self.resumable is None:
            return False
        request = envelope(message)
        if request is None:
            return False
        if request.get("type") == "session.event_ack" and channel is not self._primary:
            return True  # a controller's ack: what it has, the peer that would resume may not
        reply = self.resumable.answer_envelope(request)
        if reply is not None and channel.readyState == "open":
            self._send_within_bound(channel, reply)
        if request.get("type") == "session.close":
            self._on_close_request()
        return True

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
    """One server-side RTCPeerConnection: answers with all its candidates, and is lost when the peer
    fails, leaves, or does not connect within --ice-connect-timeout (`_lost`: closed, unless a
    subclass says otherwise)."""

    def __init__(self, name: str, settings: Settings) -> None:
        self.name = name
        self.settings = settings
        self.pc = RTCPeerConnection(rtc_configuration(configured_ice_servers(settings)))
        self.pc.on("connectionstatechange", self._on_connection_state)
        self.pc.on("datachannel", self._on_datachannel)
        self._has_channel = False
        self._connected = False
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
        self._bind(channel, channels, receiver)
        receiver.channel_opened()  # aiortc announces a remote channel once it is open

    def _bind(self, channel: RTCDataChannel, channels: ControlChannels, receiver: ControlReceiver) -> None:
        channels.attach(channel, receiver, lambda: self._lost(ends_session=False))

    def _offers(self, kind: str) -> bool:
        return any(t.kind == kind for t in self.pc.getTransceivers())

    async def _on_connection_state(self) -> None:
        state = self.pc.connectionState
        logger.info("%s: connection %s", self.name, state)
        if self.closed.is_set():  # closed by this side
            return
        if state == "connected":
            self._connected = True
            self._on_connected()
        elif state == "failed":  # a link that never came up is the peer's goodbye, as its deadline is
            self._lost(ends_session=not self._connected and self._never_connected_ends())
        elif state == "closed":  # aiortc closes a pc once its peer closed every DTLS transport
            self._lost(ends_session=True)

    async def _connect_deadline(self) -> None:
        await asyncio.sleep(self.settings.ice_connect_timeout)
        if not self._came_up():
            logger.info("%s: not connected after %.1f s, closing", self.name, self.settings.ice_connect_timeout)
            self._lost(ends_session=self._never_connected_ends())

    def _came_up(self) -> bool:
        return self.pc.connectionState == "connected"

    def _on_connected(self) -> None:
        """The connection came up (ICE and DTLS)."""

    def _never_connected_ends(self) -> bool:
        """Whether this link's failing to come up ends what it carries."""
        return True

    def _lost(self, ends_session: bool) -> None:
        """The peer failed, left or went silent; `ends_session`: it said goodbye, or never came."""
        self._close_soon()

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

    def _close_soon(self) -> None:
        if self._closing is None:
            self._closing = asyncio.ensure_future(self.close())

    async def close(self) -> None:
        raise NotImplementedError


class _PrimaryLink(_PeerLink):
    """The session's own peer connection: the one that created it, or one that resumed it since.

    It carries the session's control channel and outgoing media, feeds the peer's tracks into the
    session, and watches that the peer is still there; losing it is the session's to judge
    (`PeerSession._link_lost`).
    """

    def __init__(self, host: PeerSession, resumed: bool) -> None:
        super().__init__(host.name + (" (resumed)" if resumed else ""), host.settings)
        self.host = host
        self.resumed = resumed
        self.channel: RTCDataChannel | None = None
        self.carries_outgoing = False
        self.last_inbound_at = time.monotonic()  # the peer had surely sent something by then
        self._heard_at = time.monotonic()  # when its traffic was last seen growing
        self._suspected = False
        self._outgoing: MediaStreamTrack | None = None  # its view of the session's speech or video
        self._stopping: asyncio.Future[None] | None = None

    async def accept(self, offer: RTCSessionDescription) -> RTCSessionDescription:
        """Apply the peer's offer and return the complete (non-trickle) answer."""
        host = self.host
        self.pc.on("track", self._on_track)
        await self.pc.setRemoteDescription(offer)
        release_frames_when_complete(self.pc)
        release_audio_on_arrival(self.pc)
        decode_audio_on_the_loop(self.pc)
        if isinstance(host.outgoing, TalkerAudioTrack):
            host.outgoing.packet_ms = talker_packet_ms(offer.sdp, self.settings.talker_packet_ms)
        media = host.outgoing.kind
        if host.ingest_only:
            pass  # a publisher receives nothing: attached peers take the output
        elif self._offers(media):
            self._outgoing = host.subscribe_outgoing(on_first_recv=lambda: host._link_playing(self))
            self.pc.addTrack(self._outgoing)
            self.carries_outgoing = True
        elif not host.session.drop_output():
            raise OfferRejected(f"a {host.kind} session needs a {media} m-line to receive the generated {media}")
        answer = await self._answer()
        if host.ingest_only:
            keep_consent_while(self.pc, self._publisher_media_arriving)
        if _sends_media(offer.sdp):  # a pure viewer sends nothing steadily: aiortc's consent checks cover it
            self._tasks.spawn(self._watch_liveness())
        return answer

    def _control(self) -> tuple[ControlChannels, ControlReceiver]:
        return self.host.channels, self.host.session

    def _bind(self, channel: RTCDataChannel, channels: ControlChannels, receiver: ControlReceiver) -> None:
        self.channel = channel
        channels.attach(channel, receiver, lambda: self._lost(ends_session=False), resumed=self.resumed, primary=True)
        if self.resumed:
            self.host._resume_confirmed(self)

    def _on_connected(self) -> None:
        if self.resumed and self.host.ingest_only:  # a publisher has no channel to confirm it
            self.host._resume_confirmed(self)

    def _on_track(self, track: MediaStreamTrack) -> None:
        sink = self.host.session.media_sink
        if sink is not None:
            start_ingest(track, sink, self._tasks.spawn, self.settings.max_image_pixels)
        else:
            self._tasks.spawn(discard(track))  # a generation takes no media, but aiortc's queue must drain

    def _came_up(self) -> bool:
        """Connected, and a resumed link's channel open: until then its replay waits (ControlChannels)."""
        needs_channel = self.resumed and not self.host.ingest_only
        return super()._came_up() and (self.channel is not None or not needs_channel)

    def _never_connected_ends(self) -> bool:
        return not self.resumed  # a resume that did not come up can be tried again

    def _lost(self, ends_session: bool) -> None:
        self.host._link_lost(self, ends_session)

    def _publisher_media_arriving(self) -> bool:
        return time.monotonic() - self._heard_at < self.settings.publisher_media_timeout

    async def _watch_liveness(self) -> None:
        """Notice a peer that went away without a goodbye.

        A WHIP publisher must keep its RTP coming (FFmpeg answers no ICE consent checks, so media is
        its only sign of life: consent is kept while it arrives, patches.ice.keep_consent_while). Any other
        peer must keep sending something (media, RTCP reports, DataChannel traffic) within
        --peer-silence-timeout, well before aiortc's own consent checks would give up (~30 s). While
        the talker speaks, SUSPECT_SILENCE_S of silence already parks it (`PeerSession._link_suspect`).
        """
        publisher = self.host.ingest_only
        timeout = self.settings.publisher_media_timeout if publisher else self.settings.peer_silence_timeout
        seen = 0
        polled_at = time.monotonic()
        while True:
            period = min(SPEAKING_POLL_S if self.host.speaking else 1.0, timeout / 4)
            await asyncio.sleep(period)
            bytes_in, _, rtp_packets = await self._transport_counters()
            received = rtp_packets if publisher else bytes_in
            now = time.monotonic()
            if received > seen or self.pc.connectionState != "connected":  # the connect deadline covers setup
                seen, self._heard_at, self.last_inbound_at = received, now, polled_at
                if self._suspected:
                    self._suspected = False
                    self.host._link_heard(self)
            elif now - self._heard_at >= timeout:
                what = "RTP from the publisher" if publisher else "packets from the peer"
                logger.info("%s: no %s for %.1f s", self.name, what, timeout)
                self._lost(ends_session=False)
                return
            elif not publisher and not self._suspected and now - self._heard_at >= SUSPECT_SILENCE_S:
                self._suspected = self.host._link_suspect(self)
            polled_at = now

    def stop_media(self) -> None:
        """A link taken over: its peer's media no longer reaches the session (the new link's does),
        and it sends the peer no more of the session's (its encoder and the new link's must not
        reformat one PyAV frame in two threads: that crashes the process)."""
        if self._outgoing is not None:
            self._outgoing.stop()
        self._stopping = asyncio.ensure_future(self._tasks.cancel_all())  # its ingest and liveness

    def close_later(self, delay: float) -> None:
        """Close after `delay`: the last word on its channel (session.replaced) has time to leave."""
        if self._closing is None:
            self._closing = asyncio.ensure_future(self._close_after(delay))

    async def _close_after(self, delay: float) -> None:
        await asyncio.sleep(delay)
        await self.close()
        self.host._replaced.discard(self)

    async def close(self) -> None:
        if self.closed.is_set():
            return
        self.closed.set()
        if self._stopping is not None:
            await self._stopping
        await self._tasks.cancel_all()
        await self.pc.close()  # aiortc stops the senders, and so the link's outgoing subscription


class PeerSession:
    """A session of any kind and its primary link; it carries the session's events on its
    `control` channels and its speech or video on one outgoing track.

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
        self.name = f"session {session_id}"
        self.settings = services.settings
        self.session_id = session_id
        self.kind = kind
        self.ingest_only = ingest_only
        self.resumable = resumable_session(services.settings, session_id)
        self.channels = ControlChannels(self.resumable, self._close_soon)
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
        self._fanout = TrackFanout(self.outgoing)
        self._encoders: dict[str, SharedEncoder] = {}  # by codec MIME type, while they have viewers
        self.attached: set[AttachedPeer] = set()
        self.link = _PrimaryLink(self, resumed=False)
        self._replaced: set[_PrimaryLink] = set()  # links a resume took over, closing
        self._resuming = False
        self._closing: asyncio.Task[None] | None = None
        self.closed = asyncio.Event()

    @property
    def pc(self) -> RTCPeerConnection:
        """The primary link's peer connection (WHIP's ETag and trickle act on it)."""
        return self.link.pc

    # ----------------------------------------------------------------- the session's carrier

    def send(self, event: dict[str, Any]) -> None:
        self.channels.send(event)

    def talker(self) -> TalkerAudioTrack:
        self.outgoing = talker = TalkerAudioTrack()
        return talker

    def video(self) -> GeneratedVideoTrack:
        self.outgoing = video = GeneratedVideoTrack()
        return video

    @property
    def speaking(self) -> bool:
        return isinstance(self.outgoing, TalkerAudioTrack) and self.outgoing.speaking

    # ----------------------------------------------------------------- setup

    async def accept(self, offer: RTCSessionDescription) -> RTCSessionDescription:
        """Apply the creating peer's offer, start the session, and return the complete answer."""
        answer = await self.link.accept(offer)
        self.session.start()
        return answer

    def subscribe_outgoing(self, on_first_recv: Callable[[], None] | None = None) -> MediaStreamTrack:
        """A consumer's view of the outgoing track; every consumer gets every frame (media/fanout.py)."""
        return self._fanout.subscribe(on_first_recv)

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

    # ----------------------------------------------------------------- losing and resuming the link

    def _link_lost(self, link: _PrimaryLink, ends_session: bool) -> None:
        """The peer of `link` said goodbye (`ends_session`), or was lost: end the session, or detach it
        until a resume or the end of its grace."""
        if link is not self.link or self.closed.is_set():
            link._close_soon()  # a link already replaced, or a session already ending
            return
        if ends_session or self.resumable is None:
            self._close_soon()
            return
        self._park(link)
        self.channels.release(link.channel)
        self.channels.end_replay()
        link._close_soon()
        self.session.connection_changed()
        self.resumable.detach(self.close)

    def _link_suspect(self, link: _PrimaryLink) -> bool:
        """The talker speaks, and the peer of `link` has gone quiet: park it, rewound to before the
        silence, until it is heard again or resumed. False: nothing to suspect (resume is off)."""
        if link is not self.link or self.resumable is None:
            return False
        logger.info(
            "%s: no packets from the peer for %.1f s while speaking; holding the speech", link.name, SUSPECT_SILENCE_S
        )
        self._park(link)
        return True

    def _link_heard(self, link: _PrimaryLink) -> None:
        if link is self.link:
            self.outgoing.unpark()

    def _link_playing(self, link: _PrimaryLink) -> None:
        """The sender of `link` pulled its first frame: a resumed peer takes the output from here."""
        if link is self.link and link.resumed:
            self.outgoing.unpark()

    def _park(self, link: _PrimaryLink) -> None:
        """Hold the output that `link` carried; speech is rewound to what its peer may not have heard."""
        if not link.carries_outgoing:
            return
        if isinstance(self.outgoing, TalkerAudioTrack):
            self.outgoing.park(rewind_to=min(link.last_inbound_at, time.monotonic() - JITTER_MARGIN_S))
        else:
            self.outgoing.park()

    async def resume(
        self, offer: RTCSessionDescription, token: str, last_seq: int | None, allow_resync: bool
    ) -> RTCSessionDescription:
        """Take the session over with a new peer connection, and return its answer.

        `last_seq`: the last `server_event_seq` the client received (None: a publisher, which receives
        no events). Raises ResumeRefused (a wrong token, a gap in the journal, another resume under
        way) or an offer failure, and then changes nothing. The old link, if still up, is told
        `session.replaced` and closed.
        """
        resumable = self.resumable
        assert resumable is not None  # the caller checked that this session resumes
        if self._resuming:
            raise ResumeRefused(RESUME_CONFLICT, "another resume of this session is under way")
        if not resumable.credential.matches(token):  # checked again by resume(); here before any work
            raise ResumeRefused(INVALID_RESUME_TOKEN, "the resume token is wrong, or was rotated by a later resume")
        self._resuming = True
        try:
            link = _PrimaryLink(self, resumed=True)
            async with closed_on_failure(link):
                answer = await link.accept(offer)
            try:
                if self.closed.is_set():
                    raise ResumeRefused(RESUME_EXPIRED, "the session ended meanwhile")
                # From here on nothing awaits: no event can slip between the replay and the new link.
                given = resumable.journal.head if last_seq is None else last_seq
                replay = resumable.resume(token, given, allow_resync, max_bytes=MAX_REPLAY_BYTES)
            except ResumeRefused:
                await link.close()
                raise
        finally:
            self._resuming = False
        previous, self.link = self.link, link
        resumable.attach()
        self.session.connection_changed()
        if not previous.closed.is_set() and previous._closing is None:  # a takeover: the old link is up
            self._park(previous)
            previous.stop_media()
            self.channels.release(previous.channel, resumable.replaced_event())
            self._replaced.add(previous)
            previous.close_later(CHANNEL_DRAIN_S)
        if not self.ingest_only:  # a publisher gets no events: its controllers go on getting them
            self.channels.begin_resume([text for text in replay if isinstance(text, str)])
        if not link.carries_outgoing:
            self.outgoing.unpark()
        return answer

    def _resume_confirmed(self, link: _PrimaryLink) -> None:
        """The resumed link's channel is open (a publisher's link connected): the token it was resumed
        with is spent."""
        if link is self.link and self.resumable is not None:
            self.resumable.confirm()

    # ----------------------------------------------------------------- teardown

    def _close_soon(self) -> None:
        if self._closing is None:
            self._closing = asyncio.ensure_future(self.close())

    async def close(self) -> None:
        """Close the session, attached peers, tasks, tracks and the peer connections; idempotent."""
        if self.closed.is_set():
            return
        self.closed.set()
        if self.resumable is not None:
            self.resumable.close()
        await self.session.close()
        await self.channels.drain(CHANNEL_DRAIN_S)
        await asyncio.gather(*(peer.close() for peer in list(self.attached)))
        for encoder in list(self._encoders.values()):
            encoder.stop()
        self.outgoing.stop()
        self._fanout.stop()
        await asyncio.gather(self.link.close(), *(link.close() for link in self._replaced))
        result = self._on_closed(self)
        if asyncio.iscoroutine(result):
            await result

    async def stats(self) -> dict[str, Any]:
        stats = {"session_id": self.session_id, **self.session.stats(), "connection_state": self.pc.connectionState}
        bytes_in, bytes_out, packets_in = await self.link._transport_counters()
        stats.update(
            bytes_received=bytes_in,
            bytes_sent=bytes_out,
            rtp_packets_received=packets_in,
            attached_peers=len(self.attached),
            shared_encoders={mime: e.subscribers for mime, e in self._encoders.items()},
        )
        if self.resumable is not None:
            stats.update(self.resumable.stats())
        else:
            stats.update(attached=not self.closed.is_set(), resumes=0, journal_bytes=0)
        if isinstance(self.outgoing, TalkerAudioTrack):
            stats.update(
                talker_buffered_ms=round(self.outgoing.buffered_ms, 1),
                talker_packets_sent=self.outgoing.packets_sent,
                talker_voiced_ms_sent=self.outgoing.voiced_ms_sent,
                talker_rewound_ms=round(self.outgoing.rewound_ms),
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
