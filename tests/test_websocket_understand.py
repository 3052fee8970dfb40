"""`WS /v1/video/chat/stream` with a plain WebSocket client: vLLM-Omni's protocol, message for message."""

from __future__ import annotations

import asyncio
import base64
import io
import wave

import pytest
from aiohttp.test_utils import TestServer

from rtc_omni.app import create_app
from rtc_omni.config import Settings
from rtc_omni.engines import Engines, SyntheticVideoEngine

from .conftest import FAST_SETTINGS, RunningServer, ServerFactory, WsFactory
from .wsclient import WsClient, jpeg_b64, tone_pcm_b64

PATH = "/v1/video/chat/stream"
RED, GREEN = (230, 20, 20), (20, 200, 40)


async def configured(make_ws: WsFactory, server: RunningServer, **config: object) -> WsClient:
    client = await make_ws(server, PATH)
    await client.send({"type": "session.config", **config})
    return client


async def turn_events(client: WsClient, after: int, last: str) -> list[dict]:
    await client.wait_event(last, after=after, timeout=20)
    return client.events[after:]


async def test_a_turn_streams_text_then_wav_speech_in_the_reference_order(
    server: RunningServer, make_ws: WsFactory
) -> None:
    client = await configured(make_ws, server)
    await client.send({"type": "video.frame", "data": jpeg_b64(RED), "frame_id": "f1", "pts_ms": 0})
    ack = await client.wait_event("video.frame.ack")
    await client.send({"type": "audio.chunk", "data": tone_pcm_b64(440, 1.0)})
    mark = len(client.events)
    await client.send({"type": "video.query", "text": "What colour?"})
    events = await turn_events(client, mark, "response.audio.done")

    assert (ack["frame_id"], ack["accepted"], ack["buffered_frames"], ack["pts_ms"]) == ("f1", True, 1, 0)
    types = [e["type"] for e in events]
    assert types[:2] == ["response.start", "video.frames.consumed"]
    assert events[1]["frame_ids"] == ["f1"] and events[1]["request_id"].startswith("video-")
    assert types[-1] == "response.audio.done"
    # The reference's quirk: text.done goes out at the first audio output, deltas may follow it.
    first_audio = types.index("response.audio.delta")
    assert types[first_audio - 1] == "response.text.done" and types.count("response.text.done") == 1
    text = "".join(e["delta"] for e in events if e["type"] == "response.text.delta")
    assert "mostly red" in text and "dominant frequency about 440 Hz" in text
    assert events[first_audio - 1]["text"] == text[: len(events[first_audio - 1]["text"])]
    audio = [e for e in events if e["type"] == "response.audio.delta"]
    assert all(e["format"] == "wav" for e in audio)
    with wave.open(io.BytesIO(base64.b64decode(audio[0]["data"]))) as wav:
        assert (wav.getframerate(), wav.getnchannels(), wav.getsampwidth()) == (24_000, 1, 2)
        assert wav.getnframes() > 0
    assert "response.cancelled" not in types


async def test_vllm_omni_030_clients_get_its_speech_event_names(make_server: ServerFactory, make_ws: WsFactory) -> None:
    server = await make_server(websocket_audio_events="response.output_audio")
    client = await configured(make_ws, server)
    await client.send({"type": "video.frame", "data": jpeg_b64(RED), "frame_id": "f1"})
    await client.wait_event("video.frame.ack")
    mark = len(client.events)
    await client.send({"type": "video.query", "text": "What colour?"})
    events = await turn_events(client, mark, "response.output_audio.done")

    types = [e["type"] for e in events]
    assert not [t for t in types if t.startswith("response.audio.")]
    speech = [e for e in events if e["type"] == "response.output_audio.delta"]
    assert speech and types[-1] == "response.output_audio.done"
    with wave.open(io.BytesIO(base64.b64decode(speech[0]["data"]))) as wav:
        assert wav.getframerate() == 24_000 and wav.getnframes() > 0


async def test_text_only_turn_ends_with_the_full_text(server: RunningServer, make_ws: WsFactory) -> None:
    client = await configured(make_ws, server, modalities=["text"], num_sample_frames=2)
    await client.send({"type": "video.frame", "data": jpeg_b64(GREEN)})  # no frame_id: no ack
    mark = len(client.events)
    await client.send({"type": "video.query", "text": "colour?"})
    events = await turn_events(client, mark, "response.text.done")

    types = [e["type"] for e in events]
    assert types[0] == "response.start" and "video.frames.consumed" not in types
    assert "video.frame.ack" not in types and "response.audio.delta" not in types
    text = "".join(e["delta"] for e in events if e["type"] == "response.text.delta")
    assert events[-1]["text"] == text and "mostly green" in text


@pytest.mark.parametrize(
    ("first", "message"),
    [
        ("not json", "Invalid JSON in session.config"),
        ("[1, 2]", "Expected session.config, got: list"),
        ('{"type": "video.query"}', "Expected session.config, got: video.query"),
        ("{}", "Expected session.config, got: None"),
        ('{"type": "session.config", "num_frames": 0}', "Invalid session config: "),
    ],
)
async def test_a_bad_first_message_ends_the_session(
    server: RunningServer, make_ws: WsFactory, first: str, message: str
) -> None:
    client = await make_ws(server, PATH)
    await client.send(first)
    await client.wait_closed()
    assert [e["type"] for e in client.events] == ["error"]
    assert client.events[0]["message"].startswith(message)
    await asyncio.sleep(0.1)
    assert len(server.registry) == 0


async def test_no_config_in_time_ends_the_session(make_server: ServerFactory, make_ws: WsFactory) -> None:
    server = await make_server(config_timeout=0.3)
    client = await make_ws(server, PATH)
    await client.wait_closed()
    (event,) = client.events
    assert event.pop("server_event_seq") == 1  # numbered for a resume (docs/resume.md)
    assert event == {"type": "error", "message": "Timeout waiting for session.config"}


async def test_recoverable_errors_leave_the_session_running(make_server: ServerFactory, make_ws: WsFactory) -> None:
    server = await make_server(max_frame_size=50_000)
    client = await configured(make_ws, server)
    await client.send({"type": "video.query", "text": "too early", "audio_data": tone_pcm_b64(300, 0.5)})
    await client.send("not json")
    await client.send("[1]")
    await client.send({"type": "bogus"})
    await client.send({"type": "_internal.vad_turn"})
    await client.send({"type": "video.frame", "data": "x" * 50_001})
    await client.send({"type": "video.frame", "data": "%%%not base64%%%"})
    await client.send({"type": "video.frame", "data": base64.b64encode(b"not an image").decode()})
    await client.send({"type": "video.frame", "data": ""})  # ignored silently
    await client.send({"type": "ping"})
    await client.wait_event("pong")

    # The reader rejects what is not a JSON object at once; the rest is answered in order.
    errors = [e["message"] for e in client.events if e["type"] == "error"]
    assert sorted(errors) == sorted(
        [
            "No frames buffered",
            "Invalid JSON",
            "Messages must be JSON objects",
            "Unknown type: bogus",
            "Unknown type: _internal.vad_turn",
            "Frame too large",
            "Invalid image data",
            "Invalid image data",
        ]
    )
    # The query's audio_data stayed buffered, and the session still answers.
    await client.send({"type": "video.frame", "data": jpeg_b64(RED)})
    mark = len(client.events)
    await client.send({"type": "video.query", "text": ""})
    events = await turn_events(client, mark, "response.audio.done")
    text = "".join(e["delta"] for e in events if e["type"] == "response.text.delta")
    assert "dominant frequency about 300 Hz" in text


async def test_a_new_query_silently_replaces_the_running_turn(make_server: ServerFactory, make_ws: WsFactory) -> None:
    server = await make_server(synthetic_ttft=0.2, synthetic_token_rate=10.0)
    client = await configured(make_ws, server, modalities=["text"])
    await client.send({"type": "video.frame", "data": jpeg_b64(RED), "frame_id": "a"})
    await client.send({"type": "video.query", "text": "first"})
    first = await client.wait_event("video.frames.consumed")
    await client.wait_event("response.text.delta")
    mark = len(client.events)
    await client.send({"type": "video.query", "text": "second"})
    await client.wait_event("response.text.done", after=mark, timeout=30)

    after = client.events[mark:]
    starts = [i for i, e in enumerate(after) if e["type"] == "response.start"]
    assert len(starts) == 1
    second = next(e for e in after if e["type"] == "video.frames.consumed")
    assert second["request_id"] != first["request_id"]
    # Nothing of the first turn follows the new response.start, and no done event closed it.
    assert all(e["type"] != "response.cancelled" for e in client.events)
    assert sum(e["type"] == "response.text.done" for e in client.events) == 1
    assert 'You asked: "second".' in after[-1]["text"]
    assert server.engine.recent_aborts[-1] == first["request_id"]


async def test_video_done_waits_for_the_turn_then_ends(server: RunningServer, make_ws: WsFactory) -> None:
    client = await configured(make_ws, server)
    await client.send({"type": "video.frame", "data": jpeg_b64(RED)})
    await client.send({"type": "video.query", "text": "hi"})
    await client.send({"type": "video.done"})
    await client.send({"type": "ping"})  # never read
    await client.wait_closed(timeout=20)

    types = [e["type"] for e in client.events]
    assert types[-2:] == ["response.audio.done", "session.done"]
    assert "pong" not in types


async def test_idle_timeout_ends_without_session_done(make_server: ServerFactory, make_ws: WsFactory) -> None:
    server = await make_server(idle_timeout=0.5)
    client = await configured(make_ws, server)
    await client.wait_closed()
    assert [e["type"] for e in client.events] == ["error"]
    assert client.events[0]["message"] == "Idle timeout"


async def test_a_binary_message_ends_the_session(server: RunningServer, make_ws: WsFactory) -> None:
    client = await configured(make_ws, server)
    await client.send(b"\x00\x01")
    await client.wait_closed()
    assert client.events[-1]["type"] == "error"


async def test_a_server_without_the_engine_says_it_is_not_available(make_ws: WsFactory) -> None:
    settings = Settings(**FAST_SETTINGS)
    server = TestServer(create_app(settings, Engines(generate=SyntheticVideoEngine())), host="127.0.0.1", port=0)
    await server.start_server()
    try:
        client = await make_ws(RunningServer(server), PATH)
        await client.wait_closed()
        assert client.events == [{"type": "error", "message": "Streaming video chat is not available"}]
    finally:
        await server.close()
