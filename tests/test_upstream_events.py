"""What the remote engine reads from an upstream: each vLLM-Omni event typed once by protocol/."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest
from pydantic import BaseModel

from rtc_omni.protocol import generate, understand
from rtc_omni.protocol.codec import MalformedEvent, UnknownEvent

# Each event as vLLM-Omni sends it (no request_id on `response.*`), and what the engine reads in it.
UNDERSTAND_EVENTS: list[tuple[dict[str, Any], type[BaseModel], dict[str, Any]]] = [
    ({"type": "response.start"}, understand.ResponseStart, {}),
    ({"type": "response.text.delta", "delta": "It is "}, understand.TextDeltaEvent, {"delta": "It is "}),
    ({"type": "response.text.done", "text": "It is red."}, understand.TextDone, {"text": "It is red."}),
    (
        {"type": "response.audio.delta", "data": "UklGRg==", "format": "wav"},
        understand.AudioDeltaEvent,
        {"data": "UklGRg=="},
    ),
    ({"type": "response.output_audio.delta", "data": "UklGRg=="}, understand.AudioDeltaEvent, {"data": "UklGRg=="}),
    ({"type": "response.audio.done"}, understand.AudioDone, {}),
    ({"type": "response.output_audio.done"}, understand.AudioDone, {}),
    ({"type": "error", "message": "Query processing failed"}, understand.ErrorEvent, {"detail": None}),
    (
        {"type": "error", "message": "Query processing failed", "detail": "down"},
        understand.ErrorEvent,
        {"detail": "down"},
    ),
    ({"type": "pong"}, understand.Pong, {}),
    ({"type": "session.done"}, understand.SessionDone, {}),
]
GENERATE_EVENTS: list[tuple[dict[str, Any], type[BaseModel], dict[str, Any]]] = [
    (
        {"type": "video.start", "request_id": "video_stream-1", "format": "m4s", "config": {"prompt": "red"}},
        generate.VideoStart,
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
        generate.VideoChunkMetadata,
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
        generate.VideoChunkMetadata,
        {"kind": "trailer", "generation_chunk_index": None, "started_event_ids": []},
    ),
    (
        {"type": "session.interaction.queued", "request_id": "r", "event_id": "ui-42"},
        generate.InteractionQueued,
        {"event_id": "ui-42", "apply_from_chunk": None},
    ),
    (
        {"type": "error", "request_id": "r", "event_id": "ui-42", "code": "interaction_failed", "message": "no"},
        generate.GenerateError,
        {"code": "interaction_failed", "event_id": "ui-42", "message": "no"},
    ),
    (
        {"type": "session.done", "request_id": "r", "chunks": 3, "stopped": False},
        generate.GenerationDone,
        {"frames": None},
    ),
    ({"type": "session.pong"}, generate.SessionPong, {}),
]


@pytest.mark.parametrize(
    ("decode", "wire", "model", "read"),
    [(understand.decode_server_event, *case) for case in UNDERSTAND_EVENTS]
    + [(generate.decode_server_event, *case) for case in GENERATE_EVENTS],
    ids=lambda v: str(v)[:40],
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
    assert understand.decode_server_event(raw) == parsed
