"""Headless aiortc peers for both session kinds: the engine of `rtc-omni client`, tests and benchmarks.

A peer can resume its session on a new peer connection (`resume()`, or by itself with `auto_resume`)
when its network changes or its connection is lost: it keeps the session's resume token and the last
`server_event_seq` it received, drops any event it already has, and sends its media again through a
fresh view of each source (`Borrowed`: a sender whose connection ends stops the track it reads).
"""

from __future__ import annotations

import asyncio
import itertools
import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import aiohttp
from aiortc import (
    RTCDataChannel,
    RTCIceServer,
    RTCPeerConnection,
    RTCRtpReceiver,
    RTCRtpTransceiver,
    RTCSessionDescription,
)
from aiortc.mediastreams import MediaStreamError, MediaStreamTrack

from ..patches.jitter import release_audio_on_arrival
from ..signaling.ice import rtc_configuration
from .media import AudioRecorder, ColourVideoTrack, FrameRateCap, VideoReceiver, camera_send_fps

EventFilter = Callable[[dict[str, Any]], bool]

SEQ_FIELD = "server_event_seq"
# auto_resume: a peer that sends media hears the server's RTCP reports steadily; this long without a
# byte from the server, its connection is taken for lost (a network change), before ICE notices.
SILENCE_RESUME_S = 3.0
RESUME_BACKOFF_S = (0.5, 1.0, 2.0, 4.0)  # between tries, the last repeated until the grace is over
RESUME_FINAL = (401, 404, 409)  # a refused resume that another try cannot change...
RESUME_RETRIED_CODES = ("session_resume_conflict",)  # ...but for a 409 from a try still being answered
DEFAULT_RESUME_GRACE_S = 30.0  # the server's --resume-grace default, where its answer does not say

# What to do about a refused offer, by HTTP status.
REFUSAL_HINTS = {
    401: "pass the token the server was started with (its --auth-token) as --token (to attach: the session's token)",
    403: "a view token only watches a session: attaching needs its session token",
    429: "too many new sessions from this address: wait a minute",
    503: "the server is at its session limit: try again shortly",
}


def check_server_url(url: str) -> str:
    """`url` without a trailing slash; ValueError unless it is an http:// or https:// URL."""
    if not url.startswith(("http://", "https://")):
        raise ValueError(f"{url!r} is not an http:// or https:// URL; did you mean 'http://{url}'?")
    return url.rstrip("/")


def prefer_video_codec(transceiver: RTCRtpTransceiver, codec: str) -> None:
    """Offer only `codec` (`vp8`, `h264`) for this video m-line, so the answer must pick it."""
    wanted = f"video/{codec}".lower()
    capabilities = RTCRtpReceiver.getCapabilities("video")
    codecs = capabilities.codecs if capabilities is not None else []
    preferred = [c for c in codecs if c.mimeType.lower() == wanted]
    if not preferred:
        raise ValueError(f"unknown video codec {codec!r}")
    transceiver.setCodecPreferences(preferred + [c for c in codecs if c.mimeType.lower() == "video/rtx"])


class Borrowed(MediaStreamTrack):
    """One connection's view of a local track that outlives the connection: frames come from the
    source, and stopping the view (as aiortc's sender does when its connection ends) leaves the source
    running for the next connection. While a resume replaces a connection still up, the two share the
    source's frames: the server, taking both into one session, gets each frame once."""

    def __init__(self, source: MediaStreamTrack) -> None:
        super().__init__()
        self.kind = source.kind
        self.source = source

    async def recv(self) -> Any:
        if self.readyState != "live":
            raise MediaStreamError
        return await self.source.recv()


class SignalingError(Exception):
    """The server refused the offer."""

    def __init__(self, status: int, body: Any) -> None:
        reason = body.get("error", body) if isinstance(body, dict) else body
        hint = REFUSAL_HINTS.get(status)
        super().__init__(f"the server refused the session (HTTP {status}): {reason}" + (f"; {hint}" if hint else ""))
        self.status, self.body = status, body


@dataclass
class TurnResult:
    """What one `video.query` produced, with client-side timings in seconds."""

    request_id: str
    text: str
    events: list[dict[str, Any]]
    sent_at: float
    first_text_at: float | None = None
    done_at: float | None = None
    cancelled: bool = False
    errors: list[str] = field(default_factory=list)

    @property
    def time_to_first_text(self) -> float | None:
        return None if self.first_text_at is None else self.first_text_at - self.sent_at


class ControlClient:
    """A peer with the `control` DataChannel: offers, connects, sends messages, collects events.

    Subclasses add their media in `_add_transceivers` and consume received tracks in `_on_track`.
    """

    kind = "understand"
    channel_label = "control"

    def __init__(
        self,
        server: str,
        token: str | None = None,
        ice_servers: list[RTCIceServer] | None = None,
        relay_only: bool = False,
        control: bool = True,
        auto_resume: bool = False,
    ) -> None:
        """`ice_servers` (e.g. from GET /v1/ice-servers) are none by default; `relay_only` uses TURN
        alone; `control=False` makes a peer without a DataChannel (like a WHIP publisher);
        `auto_resume` resumes the session on a new connection when this one fails, is closed by the
        server's side, or goes silent. The local addresses ICE gathers on are the process's, set once
        by rtc_omni.patches.apply()."""
        self.server = check_server_url(server)
        self.token = token
        self._ice = (ice_servers or [], relay_only)
        self._control = control
        self.auto_resume = auto_resume
        self.events: list[dict[str, Any]] = []
        self.event_times: list[float] = []
        self._new_event = asyncio.Event()
        self.session_id: str | None = None
        self.session_token: str | None = None  # controls the session (capabilities: docs/operations.md)
        self.view_token: str | None = None  # watches it: WHEP, stats, the recording
        self.resume_token: str | None = None  # resumes it on a new connection; rotated by each resume
        self.resume_grace_s = DEFAULT_RESUME_GRACE_S  # how long the server keeps it once the connection is lost
        self.last_event_seq = 0  # the last server_event_seq received; an event at or below it is a repeat
        self.resumes = 0
        self.connect_seconds: float | None = None
        self.answer_sdp: str | None = None  # as the server sent it: aiortc's model drops a=ptime
        self.ended: str | None = None  # why the session ended under us, once it has
        self._closing = False
        self._resuming: asyncio.Task[None] | None = None
        self._watching: asyncio.Task[None] | None = None
        self.pc, self.channel = self._new_peer_connection()

    def _new_peer_connection(self) -> tuple[RTCPeerConnection, RTCDataChannel | None]:
        pc = RTCPeerConnection(rtc_configuration(*self._ice))
        channel = pc.createDataChannel(self.channel_label) if self._control else None
        if channel is not None:
            channel.on("message", self._on_message)
            channel.on("close", lambda: self._connection_lost(pc, "the server closed the session"))
        pc.on("track", self._on_track)
        pc.on("connectionstatechange", lambda: self._on_connection_state(pc))
        return pc, channel

    def _on_message(self, message: str | bytes) -> None:
        if not isinstance(message, str):
            return
        event = json.loads(message)
        seq = event.get(SEQ_FIELD) if isinstance(event, dict) else None
        if isinstance(seq, int):
            if seq <= self.last_event_seq:  # replayed on a resume, and already here
                return
            self.last_event_seq = seq
        if isinstance(event, dict) and isinstance(event.get("resume_token"), str):  # session.created, .resumed
            self.resume_token = event["resume_token"]
        self.events.append(event)
        self.event_times.append(time.monotonic())
        self._new_event.set()

    def _on_connection_state(self, pc: RTCPeerConnection) -> None:
        if pc.connectionState in ("failed", "closed"):
            self._connection_lost(pc, f"the connection to the server {pc.connectionState}")

    def _connection_lost(self, pc: RTCPeerConnection, reason: str) -> None:
        """The connection `pc` ended (not ours to mind once a resume replaced it): resume, or end."""
        if pc is not self.pc or self._closing or self.ended is not None:
            return
        if self.auto_resume and self.resume_token is not None:
            self._resume_soon(reason)
        else:
            self._end(reason)

    def _resume_soon(self, reason: str) -> None:
        if self._resuming is None or self._resuming.done():
            self._resuming = asyncio.ensure_future(self._resume_until_grace(reason))

    async def _resume_until_grace(self, reason: str) -> None:
        """Resume, retrying with a backoff until the server's grace is over; the session ends when
        the server refuses for good or the grace passed."""
        deadline = time.monotonic() + self.resume_grace_s
        for attempt in itertools.count():
            if self._closing:
                return
            try:
                await self.resume()
                return
            except SignalingError as exc:
                code = exc.body.get("code") if isinstance(exc.body, dict) else None
                if exc.status in RESUME_FINAL and code not in RESUME_RETRIED_CODES:
                    self._end(f"{reason}; the resume was refused: {exc}")
                    return
                failure: Exception = exc
            except (ConnectionError, TimeoutError, aiohttp.ClientError) as exc:
                failure = exc
            wait = RESUME_BACKOFF_S[min(attempt, len(RESUME_BACKOFF_S) - 1)]
            if time.monotonic() + wait > deadline:
                self._end(f"{reason}; not resumed within {self.resume_grace_s:g} s: {failure}")
                return
            await asyncio.sleep(wait)

    async def _watch_silence(self) -> None:
        """auto_resume for a peer that sends media: a server that sends nothing for SILENCE_RESUME_S
        (no RTCP report even) is out of reach on this connection."""
        seen, heard_at = 0, time.monotonic()
        while not self._closing and self.ended is None:
            await asyncio.sleep(SILENCE_RESUME_S / 6)
            pc = self.pc
            received = sum(r.bytesReceived for r in (await pc.getStats()).values() if r.type == "transport")
            now = time.monotonic()
            if received != seen or pc.connectionState != "connected" or self._resuming_now:
                seen, heard_at = received, now
            elif now - heard_at >= SILENCE_RESUME_S:
                self._connection_lost(pc, f"nothing from the server for {SILENCE_RESUME_S:g} s")
                heard_at = now

    @property
    def _resuming_now(self) -> bool:
        return self._resuming is not None and not self._resuming.done()

    def _end(self, reason: str) -> None:
        """The session is over: waits end at once, saying why (the server's last word if it gave one,
        e.g. "Server shutting down")."""
        if self.ended is None:
            last = next((e for e in reversed(self.events) if e.get("type") == "error" and "request_id" not in e), None)
            self.ended = f"{reason}: {last['message']}" if last is not None and "message" in last else reason
            self._new_event.set()

    def _add_transceivers(self) -> None:
        """Add the media m-lines this kind of client offers."""

    def _on_track(self, track: MediaStreamTrack) -> None:
        """Consume a track the server sends."""

    def _headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.token}"} if self.token else {}

    @property
    def session_headers(self) -> dict[str, str]:
        """The headers that open this client's session's URLs (stats, DELETE, the recording)."""
        return {"Authorization": f"Bearer {self.session_token}"} if self.session_token else self._headers()

    @property
    def view_url(self) -> str | None:
        """The WHEP URL that lets anyone holding it watch the session, and nothing more."""
        if self.session_id is None or self.view_token is None:
            return None
        return f"{self.server}/whep/{self.session_id}?access_token={self.view_token}"

    async def connect(self, kind: str | None = None, timeout: float = 10.0, session_id: str | None = None) -> None:
        """Offer, apply the answer, and wait until connected with the DataChannel open.

        `kind="control"` with a `session_id` attaches to that running session (e.g. a WHIP
        publisher's): the client's `token` must then be that session's token (or the server's).
        `kind="resume"` takes that session over with its `resume_token` (as `resume()` does, on this
        client's first connection).
        """
        self._add_transceivers()
        started = time.monotonic()
        await self._negotiate(kind or self.kind, session_id, timeout)
        self.connect_seconds = time.monotonic() - started
        if self.auto_resume and self._watching is None and self._sends_media():
            self._watching = asyncio.ensure_future(self._watch_silence())

    async def resume(self, timeout: float = 10.0) -> None:
        """Take this client's session over on a new peer connection (after a network change, or with
        the old one still up): the server replays the events missed and tells the old connection it
        was replaced. Raises SignalingError if the server refuses (401: a rotated token, 404: the
        grace is over), ConnectionError if the new connection does not come up."""
        if self.session_id is None or self.resume_token is None:
            raise RuntimeError("no session to resume: connect first, to a server with --resume-grace above 0")
        old = self.pc, self.channel
        self.pc, self.channel = self._new_peer_connection()
        self._add_transceivers()
        try:
            await self._negotiate("resume", self.session_id, timeout)
        except BaseException:
            failed = self.pc
            self.pc, self.channel = old  # the session is still the old connection's (or nobody's)
            await failed.close()
            raise
        self.resumes += 1
        await old[0].close()

    async def _negotiate(self, kind: str, session_id: str | None, timeout: float) -> None:
        await self.pc.setLocalDescription(await self.pc.createOffer())
        if "a=candidate:" not in self.pc.localDescription.sdp:
            # aiortc's sign of an unreachable TURN server or wrong / expired credentials
            raise ConnectionError("gathered no ICE candidates: check the ICE servers and TURN credentials")
        try:
            async with aiohttp.ClientSession() as http:
                offer = self.pc.localDescription.sdp
                self.answer_sdp = await self._exchange(http, offer, kind, session_id)
        except aiohttp.ClientConnectionError as exc:
            raise ConnectionError(f"cannot connect to {self.server}: is `rtc-omni serve` running there?") from exc
        await self.pc.setRemoteDescription(RTCSessionDescription(sdp=self.answer_sdp, type="answer"))
        release_audio_on_arrival(self.pc)  # the talker's last packets are heard when sent
        try:
            async with asyncio.timeout(timeout):
                while not (
                    self.pc.connectionState == "connected"
                    and (self.channel is None or self.channel.readyState == "open")
                ):
                    if self.pc.connectionState in ("failed", "closed"):
                        raise ConnectionError(f"peer connection {self.pc.connectionState}")
                    await asyncio.sleep(0.01)
        except TimeoutError:
            raise ConnectionError(f"not connected within {timeout} s (ICE {self.pc.iceConnectionState})") from None

    def _sends_media(self) -> bool:
        return any(t.sender.track is not None for t in self.pc.getTransceivers())

    async def _exchange(self, http: aiohttp.ClientSession, sdp: str, kind: str, session_id: str | None) -> str:
        """POST the offer to /v1/rtc/offer; the answer's SDP, with the session's id and tokens kept."""
        offer: dict[str, Any] = {"sdp": sdp, "type": "offer", "kind": kind}
        if session_id is not None:
            offer["session_id"] = session_id
        if kind == "resume":
            offer.update(
                resume_token=self.resume_token, last_received_server_event_seq=self.last_event_seq, allow_resync=True
            )
        async with http.post(f"{self.server}/v1/rtc/offer", json=offer, headers=self._headers()) as resp:
            try:
                body = await resp.json(content_type=None)
            except ValueError:
                body = (await resp.text())[:200]
            if resp.status != 200:
                raise SignalingError(resp.status, body)
        if not isinstance(body, dict) or "sdp" not in body:
            raise SignalingError(resp.status, f"not an rtc-omni answer: {str(body)[:200]}")
        self.session_id = body["session_id"]
        self.session_token = body.get("session_token", self.session_token)
        self.view_token = body.get("view_token", self.view_token)
        self.resume_token = body.get("resume_token", self.resume_token)
        self.resume_grace_s = float(body.get("resume_grace_s", self.resume_grace_s))
        return str(body["sdp"])

    def send(self, message: dict[str, Any] | str) -> None:
        if self.channel is None:
            raise RuntimeError("this client has no control channel")
        self.channel.send(message if isinstance(message, str) else json.dumps(message))

    async def wait_event(
        self,
        event_type: str | None = None,
        where: EventFilter | None = None,
        after: int = 0,
        timeout: float | None = 10.0,
    ) -> dict[str, Any]:
        """The first event at index >= `after` of that type matching `where`; `timeout=None` leaves
        the deadline to the caller. ConnectionError once the session has ended without one."""
        try:
            async with asyncio.timeout(timeout):
                index = after
                while True:
                    while index < len(self.events):
                        event = self.events[index]
                        index += 1
                        if (event_type is None or event.get("type") == event_type) and (where is None or where(event)):
                            return event
                    if self.ended is not None:
                        raise ConnectionError(self.ended)
                    self._new_event.clear()
                    await self._new_event.wait()
        except TimeoutError:
            awaited = f"no {event_type} event" if event_type else "no answer from the server"
            raise TimeoutError(f"{awaited} within {timeout:g} s") from None

    async def close(self) -> None:
        self._closing = True
        for task in (self._resuming, self._watching):
            if task is not None and task is not asyncio.current_task():
                task.cancel()
        await self.pc.close()


DEFAULT_SAMPLE_FPS = 2.0  # session.config's sample_fps when the client sends none


class MediaClient(ControlClient):
    """Streams camera and mic into a conversation session and records the talker.

    The camera sends camera_send_fps(DEFAULT_SAMPLE_FPS) frames per second (at most its own rate).
    """

    def __init__(
        self,
        server: str,
        video: MediaStreamTrack | None = None,
        audio: MediaStreamTrack | None = None,
        receive_audio: bool = True,
        token: str | None = None,
        ice_servers: list[RTCIceServer] | None = None,
        relay_only: bool = False,
        control: bool = True,
        video_codec: str | None = None,
        auto_resume: bool = False,
    ) -> None:
        super().__init__(server, token, ice_servers, relay_only, control, auto_resume)
        self.video, self.audio = video, audio
        self.camera: ColourVideoTrack | FrameRateCap | None = None  # the camera whose rate follows sample_fps
        self.video_sent: MediaStreamTrack | None = video  # what the video sender sends, each connection a view
        if video is not None and not getattr(video, "pre_encoded", False):  # encoded frames depend on each other
            self.camera = video if isinstance(video, ColourVideoTrack) else FrameRateCap(video)
            self.camera.max_fps = camera_send_fps(DEFAULT_SAMPLE_FPS)
            self.video_sent = self.camera
        self.video_codec = video_codec
        self.receive_audio = receive_audio
        self.recorder: AudioRecorder | None = None

    def _add_transceivers(self) -> None:
        if self.video_sent is not None:
            transceiver = self.pc.addTransceiver(Borrowed(self.video_sent), direction="sendonly")
            if self.video_codec is not None:
                prefer_video_codec(transceiver, self.video_codec)
        if self.audio is not None:
            direction = "sendrecv" if self.receive_audio else "sendonly"
            self.pc.addTransceiver(Borrowed(self.audio), direction=direction)
        elif self.receive_audio:
            self.pc.addTransceiver("audio", direction="recvonly")

    def _on_track(self, track: MediaStreamTrack) -> None:
        if track.kind == "audio":
            if self.recorder is None:
                self.recorder = AudioRecorder(track)
            else:
                self.recorder.follow(track)

    async def close(self) -> None:
        if self.recorder is not None:
            await self.recorder.stop()
        await super().close()
        for source in (self.video_sent, self.audio):
            if source is not None:
                source.stop()


class UnderstandClient(MediaClient):
    """An understanding session's peer: its camera follows the `sample_fps` of every session.config
    it sends, and it asks with `video.query`."""

    kind = "understand"
    modalities: tuple[str, ...] = ("text", "audio")  # the last session.config's

    async def configure(self, **config: Any) -> None:
        """Send session.config and confirm it applied (a ping answered without an error)."""
        mark = len(self.events)
        self.modalities = tuple(config.get("modalities", self.modalities))
        self.send({"type": "session.config", **config})
        self.send({"type": "ping"})
        event = await self.wait_event(where=lambda e: e["type"] in ("pong", "error"), after=mark)
        if event["type"] == "error":
            raise ValueError(event["message"])
        if self.camera is not None:  # the server validated it: a number in (0, 60]
            self.camera.max_fps = camera_send_fps(float(config.get("sample_fps", DEFAULT_SAMPLE_FPS)))

    async def ask(
        self, text: str, timeout: float = 30.0, on_text: Callable[[str], None] | None = None, **extra: Any
    ) -> TurnResult:
        """Send `video.query` and collect the turn until it ends (done, cancelled or failed).

        `timeout` bounds the whole turn, speech included: a spoken answer plays in real time, so
        it lasts as long as the speech. `on_text` gets each text delta as it arrives.
        """
        mark = len(self.events)
        sent_at = time.monotonic()
        self.send({"type": "video.query", "text": text, **extra})
        result: TurnResult | None = None
        text_done = False
        try:
            async with asyncio.timeout(timeout):
                start = await self.wait_event(
                    where=lambda e: e["type"] in ("response.start", "error"), after=mark, timeout=None
                )
                if start["type"] == "error":
                    raise ValueError(start["message"])
                request_id = start["request_id"]
                result = TurnResult(request_id=request_id, text="", events=[], sent_at=sent_at)
                index = self.events.index(start) + 1
                while True:
                    event = await self.wait_event(
                        where=lambda e: e.get("request_id") == request_id, after=index, timeout=None
                    )
                    index = self.events.index(event, index) + 1
                    result.events.append(event)
                    kind = event["type"]
                    if kind == "response.text.delta":
                        result.first_text_at = result.first_text_at or self.event_times[index - 1]
                        result.text += event["delta"]
                        if on_text is not None:
                            on_text(event["delta"])
                    elif kind == "response.text.done":
                        text_done = True
                        if "audio" not in self.modalities:
                            break
                    elif kind == "error":
                        result.errors.append(event["message"])
                    elif kind in ("response.audio.done", "response.cancelled"):
                        result.cancelled = kind == "response.cancelled"
                        break
                    if text_done and result.errors:
                        break
        except TimeoutError:
            if result is None:
                missing = "no response.start"
            elif not text_done:
                missing = "the answer's text did not finish"
            else:
                missing = "the answer's speech did not finish playing"
            raise TimeoutError(f"{missing} within {timeout:g} s") from None
        result.done_at = time.monotonic()
        return result


class RealtimeClient(MediaClient):
    """An OpenAI Realtime WebRTC peer (`POST /v1/realtime/calls`, as a browser app connects): camera
    and mic in, the talker back, events on the `oai-events` DataChannel."""

    kind = "realtime"
    channel_label = "oai-events"

    async def _exchange(self, http: aiohttp.ClientSession, sdp: str, kind: str, session_id: str | None) -> str:
        """POST the SDP itself; 201 with the answer, the call's id the last part of its Location. A
        resume POSTs to the call's `/resume` with the resume token: 200."""
        headers = {**self._headers(), "Content-Type": "application/sdp"}
        url, expected = f"{self.server}/v1/realtime/calls", 201
        if kind == "resume":
            url, expected = f"{url}/{session_id}/resume", 200
            headers.update({"Resume-Token": str(self.resume_token), "Last-Event-Seq": str(self.last_event_seq)})
            headers["Allow-Resync"] = "true"
        async with http.post(url, data=sdp, headers=headers) as resp:
            body = await resp.text()
            if resp.status != expected:
                raise SignalingError(resp.status, body[:200])
            self.session_id = resp.headers["Location"].rsplit("/", 1)[1]
            self.session_token = resp.headers.get("Session-Token", self.session_token)
            self.view_token = resp.headers.get("View-Token", self.view_token)
            self.resume_token = resp.headers.get("Resume-Token", self.resume_token)
        return body


class GenerateClient(ControlClient):
    """Asks a generation session for a video and receives it as a live track."""

    kind = "generate"

    def __init__(
        self,
        server: str,
        video_codec: str | None = None,
        out_path: str | None = None,
        token: str | None = None,
        ice_servers: list[RTCIceServer] | None = None,
        relay_only: bool = False,
        auto_resume: bool = False,
    ) -> None:
        super().__init__(server, token, ice_servers, relay_only, auto_resume=auto_resume)
        self.video_codec = video_codec
        self.out_path = out_path
        self.receiver: VideoReceiver | None = None
        self.fps = 24.0

    def _add_transceivers(self) -> None:
        transceiver = self.pc.addTransceiver("video", direction="recvonly")
        if self.video_codec is not None:
            prefer_video_codec(transceiver, self.video_codec)

    def _on_track(self, track: MediaStreamTrack) -> None:
        if track.kind == "video":
            if self.receiver is None:
                self.receiver = VideoReceiver(track, self.out_path, self.fps)
            else:
                self.receiver.follow(track)

    async def start(self, timeout: float = 10.0, **request: Any) -> dict[str, Any]:
        """Send session.start; returns video.start, or raises ValueError with the server's error."""
        if "fps" in request:
            self.fps = float(request["fps"])
            if self.receiver is not None and self.receiver.writer is not None:
                self.receiver.writer.fps = self.fps
        mark = len(self.events)
        self.send({"type": "session.start", **request})
        event = await self.wait_event(
            where=lambda e: e["type"] in ("video.start", "error"), after=mark, timeout=timeout
        )
        if event["type"] == "error":
            raise ValueError(event["message"])
        return event

    async def close(self) -> None:
        if self.receiver is not None:
            await self.receiver.stop()
        await super().close()
