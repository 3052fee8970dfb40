"""Opening and closing many sessions leaves nothing behind: tasks, file descriptors, peer
connections, registry entries. Resident memory growth is printed for the closing note.

Every count must return to its starting value, so a leak of one per session fails at any number
of sessions: 30 by default (10 per ending); LEAK_SESSIONS=100 for the figure in docs/operations.md.
"""

from __future__ import annotations

import asyncio
import gc
import os

import av
import pytest
from aiortc import RTCPeerConnection

from rtc_omni.client.media import COLOURS, ColourVideoTrack, ToneAudioTrack
from rtc_omni.client.rtc_peers import UnderstandClient
from rtc_omni.signaling.peer_session import PeerSession

from .conftest import RunningServer, http_json
from .waiting import server_tasks, wait_until

pytestmark = pytest.mark.media

SESSIONS = int(os.environ.get("LEAK_SESSIONS", "30"))


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def rss_mib() -> float:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def live_peer_connections() -> int:
    gc.collect()
    return sum(1 for obj in gc.get_objects() if isinstance(obj, RTCPeerConnection))


async def one_session(server: RunningServer, ending: str) -> None:
    client = UnderstandClient(
        server.url, video=ColourVideoTrack(COLOURS["green"], 160, 120, 15), audio=ToneAudioTrack(330)
    )
    try:
        await client.connect()
        # video.done waits for the turn to finish: keep that one short (no speech to play out).
        await client.configure(modalities=["text"] if ending == "video.done" else ["text", "audio"])
        await client.wait_event("video.frame.ack")
        if ending != "delete":  # the other endings come with a turn still running
            client.send({"type": "video.query", "text": "keep going"})
            await client.wait_event("response.text.delta")
        if ending == "delete":
            assert (
                await http_json(
                    server, "DELETE", f"/v1/rtc/sessions/{client.session_id}", headers=client.session_headers
                )
            )[0] == 200
        elif ending == "video.done":
            client.send({"type": "video.done"})
            await client.wait_event("session.done", timeout=30)
    finally:
        await client.close()  # for "peer close", this is the only goodbye
    await wait_until(lambda: client.session_id not in server.registry, timeout=15)


@pytest.mark.timeout(300)
async def test_many_sessions_leave_nothing_behind(server: RunningServer) -> None:
    await one_session(server, "delete")  # warm up imports, codecs and pools before counting
    await asyncio.sleep(0.5)
    fds, rss = open_fds(), rss_mib()
    endings = ["delete", "peer close", "video.done"]
    for i in range(SESSIONS):
        await one_session(server, endings[i % len(endings)])
    await wait_until(lambda: len(server.registry) == 0 and not server_tasks(), timeout=15)
    await asyncio.sleep(0.5)
    assert open_fds() <= fds
    assert live_peer_connections() == 0
    growth = rss_mib() - rss
    print(f"\n{SESSIONS} sessions opened and closed: resident memory grew {growth:.1f} MiB")


def tracked(kind: type) -> set[int]:
    """The ids of objects of `kind` the collector still tracks, garbage or not (no collection is run)."""
    return {id(obj) for obj in gc.get_objects() if isinstance(obj, kind)}


def described(ids: set[int], kind: type) -> str:
    """What holds each object left over: its own description and its referrers' types."""
    lines = []
    objects = gc.get_objects()
    for obj in objects:
        if id(obj) in ids and isinstance(obj, kind):
            holders = sorted({type(ref).__qualname__ for ref in gc.get_referrers(obj) if ref is not objects})
            lines.append(f"{obj!r} held by {', '.join(holders)}")
    return "; ".join(lines)


async def test_closed_sessions_and_their_codecs_are_freed_without_waiting_for_the_collector(
    server: RunningServer,
) -> None:
    await one_session(server, "delete")  # warm up imports, codecs and pools before counting
    gc.collect()
    # Objects alive before (another test's in this worker process, say) are not this test's sessions.
    before = {kind: tracked(kind) for kind in (PeerSession, av.CodecContext)}
    gc.disable()  # CPython's own pacing collects nothing now: only the server's collection after a close
    try:
        for ending in ["delete", "peer close", "video.done"]:
            await one_session(server, ending)

        def left() -> dict[type, set[int]]:
            return {kind: tracked(kind) - ids for kind, ids in before.items()}

        # Each closed session is a web of cycles holding its decoders and talker encoder (and their threads).
        try:
            await wait_until(lambda: not any(left().values()), timeout=10)
        except TimeoutError:
            report = " / ".join(f"{kind.__name__}: {described(ids, kind)}" for kind, ids in left().items() if ids)
            pytest.fail(f"left after the server's collections: {report}")
    finally:
        gc.enable()
