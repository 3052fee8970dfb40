"""The session skeleton on in-memory transports: codecs refuse bad input with the reference's
strings, the inbox keeps the server's own work apart from a client's flood, and both sessions run
their protocol through the shared loop with nothing but a `send` callable."""

from __future__ import annotations

import asyncio
import base64
import io
import json
from typing import Any

import pytest
from PIL import Image

from rtc_omni.config import Settings
from rtc_omni.engines import SyntheticEngine, SyntheticVideoEngine
from rtc_omni.protocol import generate_messages as generate_proto
from rtc_omni.protocol import understand_messages as understand_proto
from rtc_omni.protocol.codec import MAX_JSON_DEPTH, NestedTooDeep, Refusal, UnknownMessage, load_json
from rtc_omni.sessions.generate import GenerateSession
from rtc_omni.sessions.inbox import Inbox, WorkItem
from rtc_omni.sessions.understand import UnderstandSession

from .conftest import FAST_SETTINGS


def jpeg_b64(colour: tuple[int, int, int]) -> str:
    out = io.BytesIO()
    Image.new("RGB", (32, 24), colour).save(out, format="JPEG")
    return base64.b64encode(out.getvalue()).decode()


@pytest.mark.parametrize(
    ("raw", "awaiting_config", "message", "ends"),
    [
        ("{oops", True, "Invalid JSON in session.config", True),
        ("{oops", False, "Invalid JSON", False),
        ("[1]", True, "Expected session.config, got: list", True),
        ('"x"', False, "Messages must be JSON objects", False),
        ("[" * 5000 + "]" * 5000, False, "Invalid JSON", False),
        ('{"type": "_internal.vad_turn"}', True, "Unknown type: _internal.vad_turn", False),
    ],
)
def test_understanding_codec_refuses_with_the_reference_strings(
    raw: str, awaiting_config: bool, message: str, ends: bool
) -> None:
    assert understand_proto.decode(raw, awaiting_config=awaiting_config) == Refusal(message, ends)


@pytest.mark.parametrize("shape", ['{"a": %s}', '[1, %s, "x"]', '{"a": 1, "b": %s}'])
def test_client_json_nests_at_most_max_json_depth_levels(shape: str) -> None:
    """Deeper JSON parses, but pydantic cannot serialise it back past 255 levels: refused at the parse."""
    nested = "0"
    for _ in range(MAX_JSON_DEPTH):
        nested = shape % nested
    assert load_json(nested) is not None
    with pytest.raises(NestedTooDeep, match="nested deeper than 64 levels"):
        load_json(shape % nested)


def test_understanding_codec_types_messages_leniently_where_the_reference_is_lenient() -> None:
    def decode(msg: dict[str, Any]) -> Any:
        return understand_proto.decode(json.dumps(msg), awaiting_config=False)

    frame = decode({"type": "video.frame", "data": "abc", "frame_id": 7, "received_ts_ms": -1})
    assert isinstance(frame, understand_proto.FrameMessage)
    assert frame.data == "abc" and frame.frame_id == 7 and frame.received_ts_ms > 0  # stamped by us
    assert decode({"type": "video.frame"}).data == "" and decode({"type": "video.frame", "data": [1]}).data is None
    query = decode({"type": "video.query", "text": None, "audio_data": base64.b64encode(b"\x01\x02").decode()})
    assert (query.text, query.pcm) == ("None", b"\x01\x02")
    assert decode({"type": "audio.chunk", "data": "%%%"}).pcm == b""
    config = decode({"type": "session.config", "num_sample_frames": 2})
    assert config.config is not None and config.config.num_frames == 2
    bad = decode({"type": "session.config", "num_frames": 0})
    assert bad.config is None and bad.invalid.startswith("Invalid session config:")
    for raw_type in (None, 5, ["a"], {"b": 1}, "no.such"):
        unknown = decode({"type": raw_type} if raw_type is not None else {})
        assert isinstance(unknown, UnknownMessage) and unknown.type == raw_type


def test_generation_codec_parses_session_start_once_and_refuses_by_state() -> None:
    assert generate_proto.decode("{oops", awaiting_start=True) == Refusal("Invalid JSON in session.start", True)
    assert generate_proto.decode("[]", awaiting_start=False) == Refusal("WebSocket messages must be JSON objects")
    big = json.dumps({"type": "session.ping", "pad": "x" * 140_000})
    assert generate_proto.decode(big, awaiting_start=False) == Refusal("control message too large")
    start = generate_proto.decode('{"type": "session.start", "prompt": "p", "size": "64x48"}', awaiting_start=True)
    assert isinstance(start, generate_proto.StartMessage) and start.request is not None
    assert start.request.resolve_video_params().width == 64
    bad_format = generate_proto.decode('{"type": "session.start", "prompt": "p", "format": "mp4"}', awaiting_start=True)
    assert isinstance(bad_format, generate_proto.StartMessage) and bad_format.invalid == generate_proto.INVALID_FORMAT
    # A validator's own bug is refused like a handler's, never raised into the transport.
    broken = '{"type": "session.start", "prompt": "p", "extra_params": [1], "sampling_params": {"a": 1}}'
    assert generate_proto.decode(broken, awaiting_start=True) == Refusal("Internal error handling session.start")


class Note(WorkItem):
    name = "note"


async def test_inbox_keeps_order_and_bounds_each_path_apart() -> None:
    inbox: Inbox[str] = Inbox(max_messages=2, max_work=1, max_message_bytes=100)
    first_work = Note()
    assert inbox.put_message("a", 1) and inbox.put_work(first_work) and inbox.put_message("b", 1)
    assert not inbox.put_message("c", 1)  # the client's flood is dropped ...
    assert not inbox.put_work(Note())  # ... and so is work beyond its own bound,
    assert [await inbox.get(), await inbox.get(), await inbox.get()] == ["a", first_work, "b"]
    assert inbox.put_work(Note())  # but the client's messages never take the work's room
    assert isinstance(await inbox.get(), Note)
    assert await inbox.get(timeout=0.01) is None


async def test_inbox_bounds_client_messages_in_bytes_too() -> None:
    inbox: Inbox[str] = Inbox(max_messages=10, max_work=1, max_message_bytes=100)
    assert inbox.put_message("big", 60)
    assert not inbox.put_message("bigger", 60)  # 120 bytes would wait: dropped, though the count allows it
    assert inbox.put_message("small", 40)
    assert await inbox.get() == "big"
    assert inbox.put_message("again", 60)  # what was taken frees its bytes


class Recorder:
    """The transport side of an in-memory session: every event it sends."""

    def __init__(self) -> None:
        self.events: list[dict[str, Any]] = []

    def send(self, event: dict[str, Any]) -> None:
        self.events.append(event)

    async def wait(self, event_type: str, timeout: float = 10.0) -> dict[str, Any]:
        async with asyncio.timeout(timeout):
            while True:
                found = [e for e in self.events if e["type"] == event_type]
                if found:
                    return found[-1]
                await asyncio.sleep(0.01)


async def test_understanding_session_answers_over_an_in_memory_transport() -> None:
    settings = Settings(**FAST_SETTINGS)
    recorder, closed = Recorder(), asyncio.Event()
    session = UnderstandSession(
        session_id="s",
        settings=settings,
        engine=SyntheticEngine(ttft=0.0, token_rate=1000.0, voice="tone"),
        send=recorder.send,
        on_closed=closed.set,
    )
    session.start()
    session.receive_text(json.dumps({"type": "session.config", "modalities": ["text"]}))
    session.receive_text(json.dumps({"type": "video.frame", "data": jpeg_b64((0, 0, 255)), "frame_id": "f"}))
    session.receive_text("[1]")
    session.receive_text(json.dumps({"type": "video.query", "text": "colour?"}))
    done = await recorder.wait("response.text.done")
    assert "mostly blue" in done["text"]
    assert [e["message"] for e in recorder.events if e["type"] == "error"] == ["Messages must be JSON objects"]
    session.receive_text(json.dumps({"type": "video.done"}))
    await recorder.wait("session.done")
    await asyncio.wait_for(closed.wait(), 5)
    assert session.state == "closed" and session.stats()["errors_sent"] == 1


class NoVideo:
    fps, frames_sent, on_frame_sent = 24.0, 0, None

    async def put(self, rgb: Any) -> None: ...

    def flush(self) -> int:
        return 0

    def end_of_stream(self) -> None: ...

    async def wait_drained(self, timeout: float) -> bool:
        return True


def generation_session(recorder: Recorder, **overrides: Any) -> GenerateSession:
    return GenerateSession(
        session_id="g",
        settings=Settings(**{**FAST_SETTINGS, **overrides}),
        engine=SyntheticVideoEngine(),
        send=recorder.send,
        video=NoVideo(),
        strict_reference=True,
    )


async def test_the_wait_for_session_start_begins_when_the_control_channel_opens() -> None:
    # Over WebRTC the session exists while ICE, DTLS and SCTP are still connecting: that time must
    # not count against the client's first message.
    recorder = Recorder()
    session = generation_session(recorder, config_timeout=0.5)
    session.start()
    await asyncio.sleep(0.4)  # connecting
    session.channel_opened()
    await asyncio.sleep(0.3)  # 0.7 s since the session was made, 0.3 s since the channel opened
    session.receive_text(json.dumps({"type": "session.start", "prompt": "red", "num_frames": 2, "size": "64x64"}))
    await recorder.wait("session.done")
    assert not [e for e in recorder.events if e["type"] == "error"]
    await session.close()

    late = Recorder()
    session = generation_session(late, config_timeout=0.5)
    session.start()
    session.channel_opened()
    await asyncio.wait_for(session.closed.wait(), 5)
    assert late.events == [{"type": "error", "message": generate_proto.TIMEOUT_WAITING_FOR_START}]


async def test_a_strict_generation_session_ends_on_a_bad_start() -> None:
    recorder = Recorder()
    session = generation_session(recorder)
    session.start()
    session.receive_text(json.dumps({"type": "session.ping"}))
    await asyncio.wait_for(session.closed.wait(), 5)
    assert recorder.events == [{"type": "error", "message": "Expected session.start, got: session.ping"}]
