"""What the remote engine reads from an upstream: each vLLM-Omni event typed once by protocol/, and
what a turn or a generation makes of noise, unknown events and events it cannot read."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest
from pydantic import BaseModel

from rtc_omni.engines import (
    EngineError,
    GenerateRequest,
    RemoteUnderstandEngine,
    TextDelta,
    TurnFrame,
    UnderstandTurn,
    UpstreamPool,
)
from rtc_omni.engines.remote import RemoteGenerateEngine
from rtc_omni.protocol import generate_messages, understand_messages
from rtc_omni.protocol.codec import MalformedEvent, UnknownEvent

from .upstreams import scripted_upstream

# Each event as vLLM-Omni sends it (no request_id on `response.*`), and what the engine reads in it.
UNDERSTAND_EVENTS: list[tuple[dict[str, Any], type[BaseModel], dict[str, Any]]] = [
    ({"type": "response.start"}, understand_messages.ResponseStart, {}),
    ({"type": "response.text.delta", "delta": "It is "}, understand_messages.TextDeltaEvent, {"delta": "It is "}),
    ({"type": "response.text.done", "text": "It is red."}, understand_messages.TextDone, {"text": "It is red."}),
    (
        {"type": "response.audio.delta", "data": "UklGRg==", "format": "wav"},
        understand_messages.AudioDeltaEvent,
        {"data": "UklGRg=="},
    ),
    (
        {"type": "response.output_audio.delta", "data": "UklGRg=="},
        understand_messages.AudioDeltaEvent,
        {"data": "UklGRg=="},
    ),
    ({"type": "response.audio.done"}, understand_messages.AudioDone, {}),
    ({"type": "response.output_audio.done"}, understand_messages.AudioDone, {}),
    ({"type": "error", "message": "Query processing failed"}, understand_messages.ErrorEvent, {"detail": None}),
    (
        {"type": "error", "message": "Query processing failed", "detail": "down"},
        understand_messages.ErrorEvent,
        {"detail": "down"},
    ),
    ({"type": "pong"}, understand_messages.Pong, {}),
    ({"type": "session.done"}, understand_messages.SessionDone, {}),
]
GENERATE_EVENTS: list[tuple[dict[str, Any], type[BaseModel], dict[str, Any]]] = [
    (
        {"type": "video.start", "request_id": "video_stream-1", "format": "m4s", "config": {"prompt": "red"}},
        generate_messages.VideoStart,
        {"request_id": "video_stream-1"},
    ),
    (
        {
            "type": "video.chunk_metadata",
            "request_id": "video_stream-1",
            "kind": "media",
            "transport_chunk_index": 7,
            "generation_chunk_index": 6,
            "num_frames": 9,
            "byte_length": 184320,
            "started_event_ids": ["ui-42"],
            "active_event_ids": ["ui-42"],
            "completed_event_ids": [],
        },
        generate_messages.VideoChunkMetadata,
        {"generation_chunk_index": 6, "started_event_ids": ["ui-42"], "completed_event_ids": []},
    ),
    (
        {
            "type": "video.chunk_metadata",
            "request_id": "r",
            "kind": "trailer",
            "generation_chunk_index": None,
            "num_frames": 0,
            "started_event_ids": None,
        },
        generate_messages.VideoChunkMetadata,
        {"kind": "trailer", "generation_chunk_index": None, "started_event_ids": []},
    ),
    (
        {"type": "session.interaction.queued", "request_id": "r", "event_id": "ui-42"},
        generate_messages.InteractionQueued,
        {"event_id": "ui-42", "apply_from_chunk": None},
    ),
    (
        {"type": "error", "request_id": "r", "event_id": "ui-42", "code": "interaction_failed", "message": "no"},
        generate_messages.GenerateError,
        {"code": "interaction_failed", "event_id": "ui-42", "message": "no"},
    ),
    (
        {"type": "session.done", "request_id": "r", "chunks": 3, "stopped": False},
        generate_messages.GenerationDone,
        {"frames": None},
    ),
    ({"type": "session.pong"}, generate_messages.SessionPong, {}),
]


@pytest.mark.parametrize(
    ("decode", "wire", "model", "read"),
    [(understand_messages.decode_server_event, *case) for case in UNDERSTAND_EVENTS]
    + [(generate_messages.decode_server_event, *case) for case in GENERATE_EVENTS],
    ids=[f"understand-{case[0]['type']}" for case in UNDERSTAND_EVENTS]
    + [f"generate-{case[0]['type']}" for case in GENERATE_EVENTS],
)
def test_each_event_the_engine_reads_parses_to_its_model(
    decode: Callable[[str], BaseModel], wire: dict[str, Any], model: type[BaseModel], read: dict[str, Any]
) -> None:
    event = decode(json.dumps(wire))
    assert type(event) is model
    assert {name: getattr(event, name) for name in read} == read


@pytest.mark.parametrize(
    ("raw", "parsed"),
    [
        (
            '{"type": "response.text.delta", "delta": 5}',
            MalformedEvent(type="response.text.delta", problem="delta should be a valid string (got 5)."),
        ),
        ('{"type": "response.text.done"}', MalformedEvent(type="response.text.done", problem="text is required.")),
        ("not json", MalformedEvent(problem="not JSON")),
        ("[" * 100_000 + "]" * 100_000, MalformedEvent(problem="not JSON")),
        ("[1, 2]", MalformedEvent(problem="not a JSON object")),
        ('{"type": "session.context_lost", "message": "gone"}', UnknownEvent(type="session.context_lost")),
        ('{"type": ["response.start"]}', UnknownEvent(type=["response.start"])),
        ("{}", UnknownEvent()),
    ],
)
def test_what_does_not_fit_is_told_apart_and_never_raises(raw: str, parsed: BaseModel) -> None:
    assert understand_messages.decode_server_event(raw) == parsed


async def _answer(turn_events: list[Any]) -> str:
    """The text a text-only remote turn gives when its upstream answers the query with `turn_events`."""

    def reply(message: dict[str, Any]) -> list[Any]:
        return turn_events if message["type"] == "video.query" else []

    async with scripted_upstream(understand_messages.WEBSOCKET_PATH, reply) as url:
        engine = RemoteUnderstandEngine(
            UpstreamPool([url], understand_messages.WEBSOCKET_PATH, 10.0, 2.0, health_interval_s=0)
        )
        frame = TurnFrame(frame_id=None, pts_ms=None, jpeg=b"\xff\xd8 a frame")
        turn = UnderstandTurn(request_id="t", frames=[frame], audio_pcm16=b"", query="?", modalities=("text",))
        try:
            outputs = [output async for output in engine.generate(turn)]
        finally:
            await engine.close()
    return "".join(o.text for o in outputs if isinstance(o, TextDelta))


async def test_a_turn_skips_noise_and_events_it_does_not_know() -> None:
    answer = await _answer(
        [
            "not json",
            [1, 2],
            {"type": "response.start"},
            {"type": "video.frame.ack", "frame_id": 5},  # an ack is never looked into
            {"type": "response.text.delta", "delta": "It is "},
            {"type": "session.context_lost", "request_id": "t", "message": "gone"},
            {"type": "response.text.delta", "delta": "red."},
            {"type": "response.text.done", "text": "It is red."},
        ]
    )
    assert answer == "It is red."


@pytest.mark.parametrize(
    ("event", "reason"),
    [
        ({"type": "response.text.delta"}, "upstream sent a malformed response.text.delta event: delta is required."),
        ({"type": "error", "message": 5}, "upstream sent a malformed error event: message should be a valid string"),
        ({"type": "error", "message": "Query processing failed"}, "upstream: Query processing failed"),
    ],
)
async def test_a_turn_fails_on_an_upstream_error_or_an_event_it_cannot_read(event: dict[str, Any], reason: str) -> None:
    with pytest.raises(EngineError, match=reason.replace(".", r"\.")):
        await _answer([{"type": "response.start"}, {"type": "response.text.delta", "delta": "It is "}, event])


def _generation(events_after_start: list[Any]) -> Callable[[dict[str, Any]], list[Any]]:
    """A vLLM-Omni generation upstream: video.start, then `events_after_start`; an interaction is queued
    as vLLM-Omni queues it, without apply_from_chunk."""

    def reply(message: dict[str, Any]) -> list[Any]:
        if message["type"] == "session.start":
            start = {"type": "video.start", "request_id": "video_stream-1", "format": "m4s", "config": {}}
            return [start, *events_after_start]
        if message["type"] == "session.interaction":
            event_id = message["interaction"]["event_id"]
            queued = {"type": "session.interaction.queued", "request_id": "video_stream-1", "event_id": event_id}
            done = {"type": "session.done", "request_id": "video_stream-1", "chunks": 0, "stopped": False}
            return [queued, done]
        return []

    return reply


async def _generate(reply: Callable[[dict[str, Any]], list[Any]], interact: bool = False) -> int | None:
    """Run one remote generation against `reply`; the chunk an interaction applies from, if one was sent."""
    async with scripted_upstream(generate_messages.WEBSOCKET_PATH, reply) as url:
        engine = RemoteGenerateEngine(
            UpstreamPool([url], generate_messages.WEBSOCKET_PATH, 10.0, 2.0, health_interval_s=0)
        )
        request = GenerateRequest(request_id="g", prompt="red", width=64, height=48, num_frames=8, fps=8)
        try:
            run = asyncio.ensure_future(asyncio.wait_for(_drain(engine.generate(request)), 10))
            applies = await engine.interact("g", "ui-42", "blue") if interact else None
            await run
        finally:
            await engine.close()
    return applies


async def _drain(chunks: AsyncIterator[object]) -> None:
    async for _chunk in chunks:
        pass


async def test_a_generation_takes_vllm_omnis_own_event_shapes() -> None:
    trailer = {"type": "video.chunk_metadata", "request_id": "video_stream-1", "kind": "trailer",
               "generation_chunk_index": None, "num_frames": 0}  # fmt: skip
    applies = await _generate(_generation([{"type": "session.pong"}, {"type": "video.unknown"}, trailer]), True)
    assert applies == 1  # no apply_from_chunk: the chunk after the current one (0)


@pytest.mark.parametrize(
    ("event", "reason"),
    [
        ("not json", "the upstream sent a message that is not JSON"),
        ("[]", "the upstream sent a message that is not a JSON object"),
        ({"type": "video.chunk_metadata", "request_id": "r", "generation_chunk_index": "six", "num_frames": 9},
         "the upstream sent a malformed video.chunk_metadata event: generation_chunk_index should be a valid integer"),
        ({"type": "error", "message": "Stall timeout: no generation progress"}, "upstream: Stall timeout"),
    ],
)  # fmt: skip
async def test_a_generation_fails_on_an_upstream_error_or_a_message_it_cannot_read(event: Any, reason: str) -> None:
    with pytest.raises(EngineError, match=reason):
        await _generate(_generation([event]))
