"""A DataChannel peer that never acknowledges: its events stop at a bound and the peer is closed.

aiortc queues a DataChannel's outgoing messages without bound while the peer acknowledges nothing
(4.6 MB in 30 s for one peer). The server closes such a peer once MAX_CHANNEL_BUFFERED_BYTES are
unsent, as it disconnects a WebSocket client that stops reading, and counts it in /metrics.
"""

from __future__ import annotations

from typing import Any

import pytest

from rtc_omni.metrics import REGISTRY
from rtc_omni.signaling import peer_session

from .conftest import ClientFactory, ServerFactory
from .waiting import server_tasks, wait_until

OVERFLOWS = "rtc_omni_datachannel_overflows_total"


async def test_a_peer_that_acknowledges_no_events_is_closed(
    make_server: ServerFactory, make_client: ClientFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(peer_session, "MAX_CHANNEL_BUFFERED_BYTES", 16 * 1024)  # 1 MiB takes 70,000 pongs
    server = await make_server()
    client = await make_client(server, colour=None, tone=None, config={"modalities": ["text"]})
    before = REGISTRY.get_sample_value(OVERFLOWS) or 0.0

    async def take_nothing(chunk: Any) -> None:
        """The client's SCTP stops taking (and so acknowledging) the server's DATA."""

    client.pc.sctp._receive_data_chunk = take_nothing  # type: ignore[union-attr, method-assign]
    for _ in range(3000):  # 3000 pongs, about 45 KB
        client.send({"type": "ping"})

    await wait_until(lambda: len(server.registry) == 0, timeout=20)
    assert REGISTRY.get_sample_value(OVERFLOWS) == before + 1
    await wait_until(lambda: not server_tasks(), timeout=5)
