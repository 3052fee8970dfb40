"""N concurrent sessions against one server: CPU per session, ingest p95, turns completed.

Understanding sessions and realtime calls are fed by the replaying load generator (`replay`): every
peer sends the same pre-encoded camera and mic, so the benchmark's process stays light and N is
bounded by the server. Sessions sample at the default `sample_fps`, as a user's would.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ..client.rtc_peers import GenerateClient, MediaClient, RealtimeClient, UnderstandClient
from ..protocol.understand_messages import SessionConfig
from .common import CpuMeter, ack_latencies, percentile, process_tree
from .generate_throughput import FPS, HEIGHT, WIDTH
from .replay import ReplayTrack, replaying_client

SAMPLE_FPS: float = SessionConfig.model_fields["sample_fps"].default
TURN_EVERY_S = 5.0
INGEST_P95_LIMIT_S = 0.100
WARM_UP_S = 2.0
CUT = "client_cancelled"  # a realtime answer cancelled by the peer's next turn


@dataclass
class CapacityPoint:
    sessions: int
    server_cpu_s_per_s: float  # the whole server: its process and any workers it started
    client_cpu_s_per_s: float  # this process: the peers, on the same cores
    ingest_p50_ms: float | None = None  # understanding only
    ingest_p95_ms: float | None = None
    turns_sent: int = 0
    turns_completed: int = 0
    frames_missing: int = 0  # generation only
    min_fps: float | None = None  # generation only
    ok: bool = False
    ingest_s: list[float] = field(default_factory=list, repr=False)

    @property
    def cpu_per_session(self) -> float:
        return self.server_cpu_s_per_s / self.sessions


class SessionMode:
    """Understanding sessions (`/v1/rtc/offer`): a `video.query` a turn, which takes the mic heard
    since the last; the server acks each sampled frame. Subclasses are the sweep's other kinds."""

    name = "understand"
    noun = "understanding"
    client_class: type[MediaClient] = UnderstandClient
    acks_frames = True
    last_answer_s = TURN_EVERY_S * 2  # how long the last turns may take to be answered after the window

    async def set_up(self, client: MediaClient) -> None:
        assert isinstance(client, UnderstandClient)
        await client.configure(sample_fps=SAMPLE_FPS, enable_frame_filter=False)

    def ask(self, client: MediaClient, turn: int) -> None:
        client.send({"type": "video.query", "text": f"what now {turn}?"})

    def answered(self, event: dict[str, Any]) -> bool:
        """`response.text.done` comes once the engine has finished and its audio is in the talker."""
        return event["type"] == "response.text.done"


class RealtimeMode(SessionMode):
    """OpenAI Realtime calls (`/v1/realtime/calls`, camera sampled at 2 fps, no frame acks): the mic
    heard since the last turn is committed, then `response.create`. An answer still playing is
    cancelled first, as a user speaking again would (an understanding turn cuts the last one too)."""

    name = "realtime"
    noun = "realtime"
    client_class = RealtimeClient
    acks_frames = False
    last_answer_s = TURN_EVERY_S * 4  # the last answers play out in full: ~10 s of the synthetic engine's speech

    async def set_up(self, client: MediaClient) -> None:
        await client.wait_event("session.created", timeout=10)

    def ask(self, client: MediaClient, turn: int) -> None:
        types = [e["type"] for e in client.events]
        if types.count("response.created") > types.count("response.done"):
            client.send({"type": "response.cancel"})
        client.send({"type": "input_audio_buffer.commit"})
        client.send({"type": "response.create"})

    def answered(self, event: dict[str, Any]) -> bool:
        """`response.done` comes once the speech has played out at the peer, or been cut by the next turn."""
        if event["type"] != "response.done":
            return False
        response = event["response"]
        return response["status"] == "completed" or (response.get("status_details") or {}).get("reason") == CUT


UNDERSTAND = SessionMode()
MODES = {mode.name: mode for mode in (UNDERSTAND, RealtimeMode())}


async def _completed_turns(mode: SessionMode, client: MediaClient, sent: int, timeout: float) -> int:
    """Turns whose whole answer the session produced (`mode.answered`), waiting up to `timeout` for
    the last ones. The next understanding turn, 5 s later, may cut the playout of a long answer, as
    a user speaking again would."""
    deadline = time.monotonic() + timeout
    while True:
        done = sum(1 for e in client.events if mode.answered(e))
        if done >= sent or time.monotonic() >= deadline:
            return done
        await asyncio.sleep(0.1)


def server_meter(server_pid: int) -> CpuMeter:
    """CPU of the server's process tree, then of this process (the peers) last."""
    return CpuMeter([*process_tree(server_pid), os.getpid()])


async def idle_cpu(server_pid: int, seconds: float) -> float:
    """The server's CPU-seconds per second with no session: the baseline under every point."""
    meter = server_meter(server_pid)
    await asyncio.sleep(seconds)
    return sum(meter.per_second()[:-1])


async def session_point(
    url: str,
    server_pid: int,
    sessions: int,
    seconds: float,
    measuring: Callable[[bool], None] | None = None,
    mode: SessionMode = UNDERSTAND,
) -> CapacityPoint:
    """`sessions` replayed cameras (640x480 VP8 as the page sends it) + mics (Opus), talker on, a turn every 5 s each
    (staggered), in `mode`'s sessions. `measuring(True)` and `measuring(False)` bracket the measured
    window, for a profiler that should see the steady state only."""
    clients = [replaying_client(url, mode.client_class) for _ in range(sessions)]
    try:
        for client in clients:
            await client.connect(timeout=30)
            await mode.set_up(client)
        await asyncio.sleep(WARM_UP_S)  # steady state
        marks = [len(c.events) for c in clients]
        if measuring is not None:
            measuring(True)
        meter = server_meter(server_pid)
        started = time.monotonic()
        sent = [0] * sessions
        while (now := time.monotonic() - started) < seconds:
            for i, client in enumerate(clients):
                if now >= sent[i] * TURN_EVERY_S + i * TURN_EVERY_S / sessions:
                    mode.ask(client, sent[i])
                    sent[i] += 1
            await asyncio.sleep(0.05)
        *server_cpu, client_cpu = meter.per_second()
        if measuring is not None:
            measuring(False)
        ingest = [lat for c, m in zip(clients, marks) for lat in ack_latencies(c, _camera(c), skip=0, after=m)]
        completed = [await _completed_turns(mode, c, n, mode.last_answer_s) for c, n in zip(clients, sent)]
    finally:
        await asyncio.gather(*(c.close() for c in clients))
    p50, p95 = (percentile(ingest, 50), percentile(ingest, 95)) if ingest else (None, None)
    ingest_ok = not mode.acks_frames or (p95 is not None and p95 < INGEST_P95_LIMIT_S)
    return CapacityPoint(
        sessions=sessions,
        server_cpu_s_per_s=sum(server_cpu),
        client_cpu_s_per_s=client_cpu,
        ingest_p50_ms=None if p50 is None else round(p50 * 1000, 1),
        ingest_p95_ms=None if p95 is None else round(p95 * 1000, 1),
        turns_sent=sum(sent),
        turns_completed=sum(completed),
        ok=ingest_ok and sum(completed) == sum(sent),
        ingest_s=ingest,
    )


def _camera(client: MediaClient) -> ReplayTrack:
    assert isinstance(client.video, ReplayTrack)
    return client.video


async def generate_point(url: str, server_pid: int, streams: int, seconds: float) -> CapacityPoint:
    """`streams` concurrent 832x480@16 VP8 generations of `seconds` of video each."""
    clients = [GenerateClient(url, video_codec="vp8") for _ in range(streams)]
    num_frames = int(seconds * FPS)
    try:
        for client in clients:
            await client.connect(timeout=30)
        meter = server_meter(server_pid)
        await asyncio.gather(
            *(
                c.start(prompt=f"stream {i}", size=f"{WIDTH}x{HEIGHT}", fps=FPS, num_frames=num_frames)
                for i, c in enumerate(clients)
            )
        )
        dones = await asyncio.gather(*(c.wait_event("session.done", timeout=seconds * 4 + 30) for c in clients))
        *server_cpu, client_cpu = meter.per_second()
        await asyncio.sleep(0.3)
        missing, rates = 0, []
        for client, done in zip(clients, dones):
            assert client.receiver is not None
            frames = list(client.receiver.frames)[1:]
            missing += done["frames"] - len({f.index for f in client.receiver.frames})
            rates.append((len(frames) - 1) / (frames[-1].at - frames[0].at) if len(frames) > 1 else 0.0)
    finally:
        await asyncio.gather(*(c.close() for c in clients))
    return CapacityPoint(
        sessions=streams,
        server_cpu_s_per_s=sum(server_cpu),
        client_cpu_s_per_s=client_cpu,
        frames_missing=missing,
        min_fps=round(min(rates), 2),
        ok=missing == 0 and min(rates) >= FPS * 0.95,
    )
