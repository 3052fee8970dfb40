"""Every bad input gets vLLM-Omni's error string, and the session keeps working afterwards."""

from __future__ import annotations

import base64
import io

import numpy as np
from PIL import Image

from .conftest import ClientFactory, RunningServer, ServerFactory, http_json


def jpeg_b64(colour: tuple[int, int, int], size: tuple[int, int] = (64, 48)) -> str:
    out = io.BytesIO()
    Image.new("RGB", size, colour).save(out, format="JPEG")
    return base64.b64encode(out.getvalue()).decode()


async def next_error(client, mark: int) -> str:
    return (await client.wait_event("error", after=mark))["message"]


async def assert_turn_works(client, colour: str = "red") -> None:
    result = await client.ask("still working?")
    assert not result.errors and f"mostly {colour}" in result.text


async def test_malformed_messages_get_errors_and_the_session_goes_on(
    make_server: ServerFactory, make_client: ClientFactory
) -> None:
    server = await make_server(max_frame_size=100_000)
    client = await make_client(server, colour=None, tone=None, config={"modalities": ["text"]})
    cases: list[tuple[object, str]] = [
        ("{not json", "Invalid JSON"),
        ("[1, 2]", "Messages must be JSON objects"),
        ('"text"', "Messages must be JSON objects"),
        ({"type": "no.such.thing"}, "Unknown type: no.such.thing"),
        ({"no_type": 1}, "Unknown type: None"),
        ({"type": "_internal.frame_decode_failed", "b64": "x"}, "Unknown type: _internal.frame_decode_failed"),
        ({"type": "video.frame", "data": "A" * 100_004, "frame_id": "big"}, "Frame too large"),
        ({"type": "video.frame", "data": "not base64!", "frame_id": "b64"}, "Invalid image data"),
        (
            {"type": "video.frame", "data": base64.b64encode(b"\xff\xd8 not a jpeg").decode(), "frame_id": "jpg"},
            "Invalid image data",
        ),
        ({"type": "video.query", "text": "anything?"}, "No frames buffered"),
        (b"\x00\x01binary", "Binary messages are not supported; send JSON text"),
    ]
    for message, expected in cases:
        mark = len(client.events)
        client.send(message) if not isinstance(message, bytes) else client.channel.send(message)
        assert await next_error(client, mark) == expected, message

    mark = len(client.events)
    client.send({"type": "video.frame", "data": jpeg_b64((255, 0, 0)), "frame_id": "good"})
    ack = await client.wait_event("video.frame.ack", after=mark)
    assert ack["accepted"] and ack["frame_id"] == "good" and ack["buffered_frames"] == 1
    assert not [e for e in client.events[mark:] if e["type"] == "error"]
    await assert_turn_works(client)


async def test_audio_overflow_clears_the_buffer_and_later_audio_is_heard(
    server: RunningServer, make_client: ClientFactory
) -> None:
    client = await make_client(server, colour=None, tone=None, config={"modalities": ["text"]})
    client.send({"type": "video.frame", "data": jpeg_b64((255, 0, 0)), "frame_id": "f"})
    chunk = base64.b64encode(bytes(150_000)).decode()  # 4.7 s of silence per message
    mark = len(client.events)
    for _ in range(28):  # 4.2 MB > the 4 MiB cap
        client.send({"type": "audio.chunk", "data": chunk})
    assert await next_error(client, mark) == "Audio buffer overflow"

    status, stats = await http_json(
        server, "GET", f"/v1/rtc/sessions/{client.session_id}", headers=client.session_headers
    )
    assert status == 200
    assert stats["audio_ms_buffered"] < 10_000  # cleared, then at most the chunks after the overflow

    pcm = (0.3 * 32767 * np.sin(2 * np.pi * 1000 * np.arange(16000) / 16000)).astype("<i2").tobytes()
    result = await client.ask("what did you hear?", audio_data=base64.b64encode(pcm).decode())
    assert "dominant frequency about 1000 Hz" in result.text


async def test_config_must_come_first_and_bad_config_is_reported(
    server: RunningServer, make_client: ClientFactory
) -> None:
    client = await make_client(server, colour="red", tone=None)
    mark = len(client.events)
    client.send({"type": "ping"})
    assert await next_error(client, mark) == "Expected session.config, got: ping"
    mark = len(client.events)
    client.send("[]")
    assert await next_error(client, mark) == "Expected session.config, got: list"
    mark = len(client.events)
    client.send("{oops")
    assert await next_error(client, mark) == "Invalid JSON in session.config"
    mark = len(client.events)
    client.send({"type": "session.config", "num_frames": 0})
    message = await next_error(client, mark)
    assert message.startswith("Invalid session config:") and "num_frames" in message

    # Legacy aliases are accepted, and the session then works.
    await client.configure(num_sample_frames=2, evs_threshold=0.5, modalities=["text"])
    await client.wait_event("video.frame.ack")
    await assert_turn_works(client)
    mark = len(client.events)
    client.send({"type": "session.config"})
    assert await next_error(client, mark) == "session.config was already applied"


async def test_config_timeout_applies_defaults_and_the_session_goes_on(
    make_server: ServerFactory, make_client: ClientFactory
) -> None:
    server = await make_server(config_timeout=0.5, spoken_sentences=1)
    client = await make_client(server, colour="green", tone=None)
    assert await next_error(client, 0) == "Timeout waiting for session.config"
    await client.wait_event("video.frame.ack")
    client.modalities = ("text", "audio")
    await assert_turn_works(client, "green")
