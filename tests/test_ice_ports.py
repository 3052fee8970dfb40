"""--ice-port-min/--ice-port-max: every ICE host candidate binds inside the range and sessions connect."""

from __future__ import annotations

import pytest
from aiortc.sdp import SessionDescription
from pydantic import ValidationError

from rtc_omni import patches
from rtc_omni.config import Settings, load_settings

from .conftest import ClientFactory, ServerFactory

PORTS = range(42500, 42540)


def candidate_ports(sdp: str) -> list[int]:
    return [c.port for m in SessionDescription.parse(sdp).media for c in m.ice_candidates]


async def test_answers_use_ports_inside_the_range_and_sessions_connect(
    make_server: ServerFactory, make_client: ClientFactory
) -> None:
    server = await make_server(ice_port_min=PORTS.start, ice_port_max=PORTS.stop - 1)
    try:
        clients = [
            await make_client(server, colour="red", tone=None, config={"modalities": ["text"]}) for _ in range(2)
        ]
        for client in clients:
            ports = candidate_ports(client.pc.remoteDescription.sdp)
            assert ports and all(port in PORTS for port in ports), ports
            assert client.pc.connectionState == "connected"
        await clients[0].wait_event("video.frame.ack")
        result = await clients[0].ask("What do you see?")
        assert "mostly red" in result.text
    finally:
        patches.apply()


def test_the_range_comes_from_flags_or_environment_and_is_checked() -> None:
    settings = load_settings(environ={"RTC_OMNI_ICE_PORT_MIN": "50000", "RTC_OMNI_ICE_PORT_MAX": "50099"})
    assert settings.ice_ports == range(50000, 50100)
    assert Settings().ice_ports is None
    with pytest.raises(ValidationError):
        Settings(ice_port_min=50000)
    with pytest.raises(ValidationError):
        Settings(ice_port_min=50100, ice_port_max=50000)
