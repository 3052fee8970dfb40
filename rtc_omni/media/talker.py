"""The talker: the live outgoing audio track that speaks the model's answer.

The engine's 24 kHz float audio is held as PCM16 in a bounded buffer, and `recv()` encodes it
itself: Opus, mono, SPEECH_BITRATE, one packet of `packet_ms` per `packet_ms` of wall time. aiortc's
sender then only packetizes (a track that yields av.Packet skips its executor hop and its per-sample
audio-level loop), and the packet is encoded once for every consumer (media/fanout.py).

While there is nothing to say, `recv()` waits: nothing is encoded and nothing is sent. Each pause
starts with TAIL_PACKETS encoded silent packets (the first carries the encoder's lookahead, the end
of the speech; a peer's decoder then fades out from silence; and a plain aiortc receiver, which
holds four packets, hands out the last of the speech) and ends by re-basing the timestamps on the
wall clock, so the peer's jitter buffer sees a pause in a steady stream, as after Opus DTX.

At most one packet is out of the talker's hands at a time. An interrupt (`flush()`) while speech
may still be held at the peer sends FLUSH_BURST_PACKETS short silent packets at once, ahead of their
slots: a plain aiortc receiver, which holds the last four packets it got, then releases the speech
it held one network hop after the interrupt instead of four packet times later (at 120 ms packets,
~0.5 s of speech the user would hear after asking it to stop). They are FLUSH_PACKET_MS long, so the
RTP clock runs only 50 ms ahead of its slots (100 ms at most, however many interrupts come), and an
answer right after the interrupt starts at most that much later. The rest of the silent packets keep
their slots, from a fresh encoder: the old one's lookahead holds the end of the cut speech.

`hold()` stops the speech the same way but keeps what was not yet sent, and `release()` goes on
from there: a barge-in that proves to be a cough resumes the answer where the user stopped hearing it.

`park()` stops it while the session has no connection to speak into (a lost peer awaiting its resume,
signaling/peer_session.py), apart from the barge-in hold, which a `release()` must not end. The talker
keeps the last REWIND_S of speech it sent, with its send times, so a park can put back what was sent
after the peer was last heard from: `unpark()` on the resumed connection plays it again first.
"""

from __future__ import annotations

import asyncio
import fractions
import time
from collections import deque

import av
import numpy as np
from aiortc.mediastreams import MediaStreamError, MediaStreamTrack
from av.audio.codeccontext import AudioCodecContext

from ..config import DEFAULT_TALKER_PACKET_MS
from ..pcm import TALKER_SAMPLE_RATE
from .echo import EchoReference

RTP_CLOCK = 48_000  # Opus's RTP clock, whatever the rate encoded
SPEECH_BITRATE = 32_000  # wideband speech, mono
# Of 0-10 (libopus's default is 10): a 60 ms packet in 0.16 ms against 0.25 ms at 5, the same size,
# with no loss a recogniser hears (docs/benchmarks.md).
OPUS_COMPLEXITY = 3
# libopus's "audio" application codes 32 kb/s as CELT, ~4x cheaper than "voip" (SILK/hybrid), with
# no loss in what a recogniser hears (docs/benchmarks.md)
OPUS_APPLICATION = "audio"
TAIL_PACKETS = 5  # aiortc's audio jitter buffer releases a packet once 4 more have arrived
# One more than that buffer holds: the speech it held is released, and so is the first silent packet,
# which a peer's decoder turns into the fade of the cut speech.
FLUSH_BURST_PACKETS = 5
FLUSH_PACKET_MS = 10  # each burst packet's audio: the RTP clock runs 40 ms ahead, not 4 packet times
_BYTES_PER_SAMPLE = 2
_REANCHOR_AFTER_S = 0.2  # behind the clock by more than this: restart the clock instead of bursting
_TIME_BASE = fractions.Fraction(1, RTP_CLOCK)
# Speech kept after it was sent, for a park to rewind: a peer lost while speaking is noticed within
# about 2 s of silence (signaling/peer_session.py), and its jitter buffer adds a little.
REWIND_S = 4.0
_REWIND_BYTES = int(REWIND_S * TALKER_SAMPLE_RATE) * _BYTES_PER_SAMPLE


def opus_speech_encoder(packet_ms: int) -> AudioCodecContext:
    """libopus for the talker's 24 kHz mono PCM16, one packet per `packet_ms` of audio."""
    codec = av.CodecContext.create("libopus", "w")
    assert isinstance(codec, AudioCodecContext)
    codec.sample_rate, codec.layout, codec.format = TALKER_SAMPLE_RATE, "mono", "s16"
    codec.bit_rate = SPEECH_BITRATE
    codec.time_base = fractions.Fraction(1, TALKER_SAMPLE_RATE)
    codec.options = {
        "application": OPUS_APPLICATION,
        "frame_duration": str(packet_ms),
        "compression_level": str(OPUS_COMPLEXITY),
    }
    codec.open()
    return codec


class TalkerAudioTrack(MediaStreamTrack):
    """An outgoing audio track of Opus packets fed by the engine, paced in real time."""

    kind = "audio"

    def __init__(self, max_buffer_s: float = 30.0, write_timeout_s: float = 60.0) -> None:
        super().__init__()
        self.max_buffer_bytes = int(max_buffer_s * TALKER_SAMPLE_RATE) * _BYTES_PER_SAMPLE
        self.write_timeout_s = write_timeout_s
        # --talker-packet-ms, or less when the peer's offer asks (signaling/ptime.py), set before media flows
        self.packet_ms = DEFAULT_TALKER_PACKET_MS
        self._encoder: AudioCodecContext | None = None
        self._burst_encoder: AudioCodecContext | None = None
        self._buffer = bytearray()
        self._space = asyncio.Event()
        self._space.set()
        self._drained = asyncio.Event()
        self._drained.set()
        self._audio = asyncio.Event()  # wakes an idle recv()
        self._send_now = asyncio.Event()  # a flush's burst: wakes a recv() waiting for its packet's slot
        self._burst_left = 0  # short silent packets a flush sends at once
        self._held = False  # hold(): the buffer waits, silence is sent
        self._parked = False  # park(): no connection to speak into; apart from the hold
        self._sent: deque[tuple[float, bytes]] = deque()  # (sent at, voiced PCM16), REWIND_S at most
        self._sent_bytes = 0
        self._start: float | None = None
        self._pts = 0  # of the next packet, in RTP clock units since _start
        self._paused = True  # the previous packet time passed with nothing to send
        self._tail_left = 0  # silent packets still to send before the pause
        self.packets_sent = 0
        self.voiced_ms_sent = 0  # milliseconds of packets that carried the engine's audio
        self.rewound_ms = 0.0  # speech put back by park(rewind_to=...): sent again after a resume
        self.echo = EchoReference()

    @property
    def speaking(self) -> bool:
        """Engine audio is waiting to be sent."""
        return bool(self._buffer)

    @property
    def held(self) -> bool:
        return self._held

    @property
    def parked(self) -> bool:
        return self._parked

    @property
    def buffered_ms(self) -> float:
        return len(self._buffer) / _BYTES_PER_SAMPLE / TALKER_SAMPLE_RATE * 1000.0

    async def write(self, pcm16: bytes) -> None:
        """Queue 24 kHz PCM16 mono audio; waits (bounded) while the buffer is full."""
        if not pcm16:
            return
        async with asyncio.timeout(self.write_timeout_s):
            while len(self._buffer) >= self.max_buffer_bytes:
                self._space.clear()
                await self._space.wait()
        self._buffer.extend(pcm16)
        self._drained.clear()
        self._audio.set()

    def flush(self) -> float:
        """Drop everything not yet sent, silent packets follow; returns the milliseconds dropped.

        The silent packets go out even when nothing was playing: a peer that waits for silence
        after an interrupt hears it, whenever the interrupt came.
        """
        dropped_ms = self.buffered_ms
        self._silence()
        self._held = False
        self._buffer.clear()
        self._forget_sent()  # what an interrupt cut is never played again
        self._space.set()
        self._drained.set()
        return dropped_ms

    def hold(self) -> None:
        """Stop the speech at once, keeping what was not sent for `release()`: the burst that ends
        it at the peer goes, the tail waits (a release goes on at once, a flush sends it)."""
        if not self._held:
            self._burst()
            self._held = True
            self._tail_left = 0

    def release(self) -> None:
        """Go on with the speech `hold()` kept, from its first unsent sample, at once: the peer's
        silence lasts no longer than the hold (the clock may run a packet ahead, never more)."""
        if self._held:
            self._held = False
            self._audio.set()
            if not self._ahead():
                self._send_now.set()

    def park(self, rewind_to: float | None = None) -> None:
        """Stop sending speech until `unpark()`, keeping it all; `rewind_to` (time.monotonic()): also
        put the speech sent after it back in front, to be played again (what the peer never heard)."""
        self._parked = True
        again = bytearray()
        while rewind_to is not None and self._sent and self._sent[-1][0] > rewind_to:
            _at, chunk = self._sent.pop()
            self._sent_bytes -= len(chunk)
            again[:0] = chunk
        if again:
            self._buffer[:0] = again
            self.rewound_ms += len(again) / _BYTES_PER_SAMPLE / TALKER_SAMPLE_RATE * 1000.0
            self._drained.clear()
            self._encoder = None  # its lookahead holds speech from past the rewind point

    def unpark(self) -> None:
        """Go on speaking (a connection takes the audio again), from the first sample not heard."""
        if self._parked:
            self._parked = False
            self._audio.set()

    def _remember_sent(self, chunk: bytes) -> None:
        self._sent.append((time.monotonic(), chunk))
        self._sent_bytes += len(chunk)
        while self._sent_bytes > _REWIND_BYTES:
            self._sent_bytes -= len(self._sent.popleft()[1])

    def _forget_sent(self) -> None:
        self._sent.clear()
        self._sent_bytes = 0

    def _silence(self) -> None:
        """The silent packets that end the speech at the peer: a burst at once where speech may be
        held there, then the tail in its slots."""
        self._burst()
        self._tail_left = TAIL_PACKETS
        self._audio.set()

    def _burst(self) -> None:
        if self._may_hold_speech() and not self._ahead():
            self._burst_left = FLUSH_BURST_PACKETS
            self._send_now.set()
            self._audio.set()
            self._encoder = None  # its lookahead holds the cut speech, which must not follow the silence

    def _may_hold_speech(self) -> bool:
        """Speech is being sent, or fewer silent packets than a peer holds went out since the last."""
        return self._sending or self._tail_left > TAIL_PACKETS - FLUSH_BURST_PACKETS

    def _ahead(self) -> bool:
        """The clock already runs ahead of the next slot by a burst (one just went): interrupts in
        quick succession must not push it ever further ahead."""
        burst_ms = FLUSH_BURST_PACKETS * FLUSH_PACKET_MS
        return self._start is not None and self._due() - time.monotonic() > (self.packet_ms + burst_ms) / 1000

    async def wait_drained(self, timeout: float) -> bool:
        """Wait until everything queued has been handed to the sender; False on timeout."""
        try:
            async with asyncio.timeout(timeout):
                await self._drained.wait()
            return True
        except TimeoutError:
            return False

    async def recv(self) -> av.Packet:  # type: ignore[override]
        while True:
            if self.readyState != "live":
                raise MediaStreamError
            if self._burst_left:
                return self._burst_packet()
            if self._sending or self._tail_left:
                await self._wait_for_packet_time()
                if self._burst_left:  # a flush came meanwhile
                    continue
                if self._sending or self._tail_left:
                    return self._next_packet()
            self._paused = True
            self._audio.clear()
            await self._audio.wait()

    async def _wait_for_packet_time(self) -> None:
        """Sleep until the next packet is due, or until it should go at once; after a pause (or a
        stall), re-base on the wall clock."""
        now = time.monotonic()
        if self._start is None:
            self._start = now
        late = now - self._due()
        if late > 0 and (self._paused or late > _REANCHOR_AFTER_S):
            self._pts += round(late * RTP_CLOCK)
        elif late < 0 and not self._send_now.is_set():
            try:
                async with asyncio.timeout(-late):
                    await self._send_now.wait()
            except TimeoutError:
                pass
        self._send_now.clear()  # one packet goes at once (a release), the rest keep their slots
        self._paused = False

    @property
    def _sending(self) -> bool:
        return bool(self._buffer) and not self._held and not self._parked

    def _due(self) -> float:
        """When the next packet's audio starts, on the monotonic clock."""
        assert self._start is not None
        return self._start + self._pts / RTP_CLOCK

    def _next_packet(self) -> av.Packet:
        if self._encoder is None:
            self._encoder = opus_speech_encoder(self.packet_ms)
        frame_bytes = self._encoder.frame_size * _BYTES_PER_SAMPLE
        chunk = bytes(self._buffer[:frame_bytes]) if self._sending else b""
        del self._buffer[: len(chunk)]
        pcm = np.frombuffer(chunk + bytes(frame_bytes - len(chunk)), dtype="<i2")
        if chunk:
            self._remember_sent(chunk)
            self.echo.played(pcm, self._pts)
            self.voiced_ms_sent += self.packet_ms
            self._tail_left = TAIL_PACKETS
            if len(self._buffer) < self.max_buffer_bytes:
                self._space.set()
            if not self._buffer:
                self._drained.set()
        else:
            self._tail_left -= 1
        frame = av.AudioFrame.from_ndarray(pcm.reshape(1, -1), format="s16", layout="mono")
        frame.sample_rate = TALKER_SAMPLE_RATE
        packets = self._encoder.encode(frame)  # libopus returns one packet per whole frame
        packet = packets[0]
        packet.pts, packet.time_base = self._pts, _TIME_BASE
        self._pts += self._encoder.frame_size * RTP_CLOCK // TALKER_SAMPLE_RATE
        self.packets_sent += 1
        return packet

    def _burst_packet(self) -> av.Packet:
        """One short silent packet of a flush's burst, sent at once."""
        self._send_now.clear()
        if self._start is None:
            self._start = time.monotonic()
        if self._burst_encoder is None:
            self._burst_encoder = opus_speech_encoder(FLUSH_PACKET_MS)
        samples = self._burst_encoder.frame_size
        frame = av.AudioFrame.from_ndarray(np.zeros((1, samples), dtype="<i2"), format="s16", layout="mono")
        frame.sample_rate = TALKER_SAMPLE_RATE
        packet = self._burst_encoder.encode(frame)[0]
        packet.pts, packet.time_base = self._pts, _TIME_BASE
        self._pts += samples * RTP_CLOCK // TALKER_SAMPLE_RATE
        self._burst_left -= 1
        self.packets_sent += 1
        return packet

    def stop(self) -> None:
        self.flush()  # also wakes a waiting recv(), which then ends
        super().stop()
