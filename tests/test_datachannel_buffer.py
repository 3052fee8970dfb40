"""A DataChannel peer that never acknowledges: its events stop at a bound and the peer is closed.

aiortc queues a DataChannel's outgoing messages without bound while the peer acknowledges nothing
(4.6 MB in 30 s for one peer). The server closes such a peer once its next event would leave more
than MAX_CHANNEL_BUFFERED_BYTES unsent, as it disconnects a WebSocket client that stops reading, and
counts it in /metrics. The bound is checked before an event is queued: checked after, one event past
it was queued whole (a silent peer cost ~34 MB before it was closed). Its session, resumable by a
new connection, ends when the grace for that runs out (a short one here).
"""

from __future__ import annotations

from typing import Any

import pytest

from rtc_omni.client.rtc_peers import ControlClient, RealtimeClient
from rtc_omni.metrics import REGISTRY
from rtc_omni.signaling import peer_session

from .conftest import ClientFactory, ServerFactory
from .waiting import server_tasks, wait_until

OVERFLOWS = "rtc_omni_datachannel_overflows_total"
BOUND = 16 * 1024  # 1 MiB takes 70,000 pongs
GRACE = {"resume_grace": 1.0}


async def take_nothing(chunk: Any) -> None:
    """In place of the client's SCTP receiver: it stops taking (and so acknowledging) the server's DATA."""


def stop_acknowledging(client: ControlClient) -> None:
    client.pc.sctp._receive_data_chunk = take_nothing  # type: ignore[union-attr, method-assign]


async def test_a_peer_that_acknowledges_no_events_is_closed(
    make_server: ServerFactory, make_client: ClientFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(peer_session, "MAX_CHANNEL_BUFFERED_BYTES", BOUND)
    server = await make_server(**GRACE)
    client = await make_client(server, colour=None, tone=None, config={"modalities": ["text"]})
    before = REGISTRY.get_sample_value(OVERFLOWS) or 0.0

    stop_acknowledging(client)
    for _ in range(3000):  # 3000 pongs, about 45 KB
        client.send({"type": "ping"})

    await wait_until(lambda: len(server.registry) == 0, timeout=20)
    assert REGISTRY.get_sample_value(OVERFLOWS) == before + 1
    await wait_until(lambda: not server_tasks(), timeout=5)


def record_peak(channel: Any) -> list[int]:
    """The most bytes `channel` ever held unsent, updated as aiortc counts them."""
    peak = [0]
    count = channel._addBufferedAmount

    def counting(amount: int) -> None:
        count(amount)
        peak[0] = max(peak[0], channel.bufferedAmount)

    channel._addBufferedAmount = counting
    return peak


def update(instructions_chars: int) -> dict[str, Any]:
    """A session.update whose session.updated echoes about `instructions_chars` bytes more than usual."""
    return {"type": "session.update", "session": {"instructions": "x" * instructions_chars}}


async def test_no_event_is_queued_past_the_bound(make_server: ServerFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(peer_session, "MAX_CHANNEL_BUFFERED_BYTES", BOUND)
    server = await make_server(**GRACE)
    client = RealtimeClient(server.url, receive_audio=False)
    try:
        await client.connect()
        await client.wait_event("session.created")
        peer = server.registry.get(client.session_id)
        peak = record_peak(peer.channels._channels[0])
        # The peer takes 256 KiB messages (aiortc's default), but one event larger than the bound is not sent.
        client.send(update(BOUND + 1))
        assert "was dropped" in (await client.wait_event("error"))["error"]["message"]  # the realtime shape
        mark = len(client.events)
        client.send(update(10))
        await client.wait_event("session.updated", after=mark)

        stop_acknowledging(client)
        for _ in range(8):  # each session.updated is ~7 KB: the third would pass the bound
            client.send(update(6000))
        await wait_until(lambda: len(server.registry) == 0, timeout=20)
        assert 0 < peak[0] <= BOUND
    finally:
        await client.close()
