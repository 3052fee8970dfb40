"""One outgoing track read by many consumers, none of them missing a frame.

A session's outgoing track (talker audio, generated video) feeds the creating peer's RTP sender
and each shared encoder of its viewers. aiortc's MediaRelay cannot do this without loss:
unbuffered it keeps only the latest frame, so a consumer still encoding one frame when the next
arrives never sees that frame (under CPU load the creator lost ~10 of 96 generated frames and the
viewers ~35); buffered it queues without bound. `TrackFanout` gives every consumer a small
bounded queue and reads the source only when each consumer that is reading has room, so a slow
consumer slows the source instead: the source's own clock slips (GeneratedVideoTrack and
TalkerAudioTrack re-base rather than burst) and no frame is skipped.

A consumer is counted from its first `recv()` (an RTP sender starts reading once its peer is
connected) and receives frames read from then on. One that holds its queue full for STALLED_S no
longer holds the others back: its oldest frame is dropped instead, counted in
`rtc_omni_outgoing_frames_dropped_total`.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable

import av
from aiortc.mediastreams import MediaStreamError, MediaStreamTrack

from .. import metrics

STALLED_S = 2.0
# Frames each consumer may have waiting while it encodes the one before: one is enough to lose
# none. Audio keeps one, so an interrupt that flushes the talker is heard within a packet or two;
# video keeps two, and beyond them the source's clock slips (one re-base, no burst at the peer).
QUEUE_FRAMES = {"audio": 1, "video": 2}

Media = av.frame.Frame | av.Packet  # what a MediaStreamTrack's recv() returns


class FanoutTrack(MediaStreamTrack):
    """One consumer's view of a TrackFanout's source: every frame from its first recv() on."""

    def __init__(self, fanout: TrackFanout, on_first_recv: Callable[[], None] | None = None) -> None:
        super().__init__()
        self.kind = fanout.source.kind
        self.reading = False
        self._fanout = fanout
        self._on_first_recv = on_first_recv
        self._frames: deque[Media] = deque()
        self._arrived = asyncio.Event()

    @property
    def full(self) -> bool:
        return len(self._frames) >= QUEUE_FRAMES[self.kind]

    def put(self, frame: Media) -> None:
        self._frames.append(frame)
        self._arrived.set()

    def drop_oldest(self) -> None:
        self._frames.popleft()
        metrics.OUTGOING_FRAMES_DROPPED.labels(self.kind).inc()

    def wake(self) -> None:
        self._arrived.set()

    async def recv(self) -> Media:  # type: ignore[override]
        if not self.reading:
            self.reading = True
            self._fanout.start()
            if self._on_first_recv is not None:
                self._on_first_recv()
        while not self._frames:
            if self.readyState != "live" or self._fanout.ended:
                raise MediaStreamError
            self._arrived.clear()
            await self._arrived.wait()
        frame = self._frames.popleft()
        self._fanout.room_made()
        return frame

    def stop(self) -> None:
        if self.readyState == "live":
            super().stop()
            self._arrived.set()
            self._fanout.unsubscribe(self)


class TrackFanout:
    """Reads `source` once, from the first consumer's first recv() until the source ends."""

    def __init__(self, source: MediaStreamTrack) -> None:
        self.source = source
        self.ended = False
        self._consumers: list[FanoutTrack] = []
        self._room = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    def subscribe(self, on_first_recv: Callable[[], None] | None = None) -> FanoutTrack:
        """A new consumer; `on_first_recv` runs when it starts reading (its peer is connected)."""
        track = FanoutTrack(self, on_first_recv)
        self._consumers.append(track)
        return track

    def unsubscribe(self, track: FanoutTrack) -> None:
        if track in self._consumers:
            self._consumers.remove(track)
        self._room.set()

    def room_made(self) -> None:
        self._room.set()

    def start(self) -> None:
        if self._task is None and not self.ended:
            self._task = asyncio.ensure_future(self._run())

    def stop(self) -> None:
        """Stop reading; consumers end once their queues are empty. Idempotent."""
        self.ended = True
        if self._task is not None:
            self._task.cancel()
        for track in self._consumers:
            track.wake()

    async def _run(self) -> None:
        try:
            while True:
                await self._wait_for_room()
                frame = await self.source.recv()
                for track in self._consumers:
                    if track.reading:
                        track.put(frame)
        except MediaStreamError:
            self.stop()

    async def _wait_for_room(self) -> None:
        """Until every reading consumer can take one more frame; after STALLED_S, make room."""
        try:
            async with asyncio.timeout(STALLED_S):
                while any(track.reading and track.full for track in self._consumers):
                    self._room.clear()
                    await self._room.wait()
        except TimeoutError:
            for track in self._consumers:
                if track.reading and track.full:
                    track.drop_oldest()
