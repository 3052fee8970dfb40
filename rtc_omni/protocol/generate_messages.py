"""Messages of a generation session: vLLM-Omni's `/v1/realtime/video` protocol over the DataChannel.

`VideoGenerationRequest` mirrors vLLM-Omni's request model and its resolution rules; `decode`
parses each client message once into the `ClientMessage` union (a `session.start` into its
request, or the error it earns); the server events add what a live RTP track needs
(`video.chunk_metadata` per engine chunk, frame counts).
"""

from __future__ import annotations

import re
from typing import Annotated, Any, ClassVar, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, field_validator, model_validator

from .codec import (
    BINARY_NOT_SUPPORTED,
    DecodedEvent,
    Refusal,
    ServerEvent,
    TypedMessage,
    UnknownMessage,
    decode_event,
    decode_message,
    message_parser,
    parsed_or_invalid,
)
from .validation import shortened

WEBSOCKET_PATH = "/v1/realtime/video"
RECORDING_PATH = "/v1/rtc/sessions/{session_id}/recording"  # GET: the MP4 of a `record: true` generation
DEFAULT_FPS = 24
MAX_START_MESSAGE_BYTES = 4 * 1024 * 1024
MAX_CONTROL_MESSAGE_BYTES = 128 * 1024

# vLLM-Omni's own error strings, kept verbatim: its clients match them (docs/generate.md lists them).
TIMEOUT_WAITING_FOR_START = "Timeout waiting for session.start"
START_TOO_LARGE = "session.start message too large"
INVALID_JSON_IN_START = "Invalid JSON in session.start"
START_NOT_AN_OBJECT = "session.start must be a JSON object"
INVALID_FORMAT = "Invalid session.start format: expected 'm4s'."
CONTROL_TOO_LARGE = "control message too large"
INVALID_JSON_MESSAGE = "Invalid JSON message"
CONTROL_NOT_AN_OBJECT = "WebSocket messages must be JSON objects"
STALL_TIMEOUT = "Stall timeout: no generation progress"
NOT_AVAILABLE = "Streaming video generation is not available"  # a server without this endpoint
# Ours, in the same style.
PROMPT_UPDATE_REPLACED = "session.prompt_update is not supported; send session.interaction instead"
START_ALREADY_RECEIVED = "session.start was already received; one session generates one video"
EVENT_ID_CONFLICT = "event_id_conflict"
INTERACTION_FAILED = "interaction_failed"
# vLLM-Omni's prompt interactions blend over this many chunks when the client gives no transition_chunks.
DEFAULT_TRANSITION_CHUNKS = 3
INVALID_INTERACTION = "invalid_interaction"


def expected_start_error(got: Any) -> str:
    return f"Expected session.start, got: {shortened(got)}"


def invalid_start_error(details: str) -> str:
    return f"Invalid session.start: {details}"


def model_mismatch_error(requested: str, served: str) -> str:
    return f"Model mismatch: request specifies '{shortened(requested)}' but server is running '{served}'."


def invalid_interaction_error(details: str) -> str:
    return f"Invalid session.interaction: {details}"


def duplicate_event_id_error(event_id: str) -> str:
    return f"Duplicate event_id: {shortened(event_id)}"


def unknown_message_type_error(msg_type: Any) -> str:
    return f"Unknown message type: {shortened(msg_type)}"


# Request fields that override the engine's diffusion defaults only when the client sets them.
SAMPLING_FIELDS = (
    "num_inference_steps",
    "guidance_scale",
    "guidance_scale_2",
    "true_cfg_scale",
    "seed",
    "boundary_ratio",
    "flow_shift",
)

_SIZE = re.compile(r"^(\d+)x(\d+)$")


class VideoParams(BaseModel):
    width: int | None = Field(None, ge=1)
    height: int | None = Field(None, ge=1)
    num_frames: int | None = Field(None, ge=1)
    fps: int | None = Field(None, ge=1)


class VideoGenerationRequest(BaseModel):
    """`session.start`: vLLM-Omni's VideoGenerationRequest, plus `record` (our extension)."""

    model_config = ConfigDict(extra="ignore")

    prompt: str
    model: str | None = None
    negative_prompt: str | None = None
    seconds: str | None = Field(None, pattern=r"^[1-9]\d*$")
    size: str | None = None
    width: int | None = Field(None, ge=1)
    height: int | None = Field(None, ge=1)
    fps: int | None = Field(None, ge=1)
    num_frames: int | None = Field(None, ge=1)
    video_params: VideoParams | None = None
    num_inference_steps: int | None = Field(None, ge=1, le=200)
    guidance_scale: float | None = Field(None, ge=0.0, le=20.0)
    guidance_scale_2: float | None = Field(None, ge=0.0, le=20.0)
    true_cfg_scale: float | None = Field(None, ge=0.0, le=20.0)
    boundary_ratio: float | None = Field(None, ge=0.0, le=1.0)
    flow_shift: float | None = None
    seed: int | None = None
    extra_params: dict[str, Any] | None = None
    lora: dict[str, Any] | None = None
    # Validated and echoed but unused here, as in the reference handler.
    image_reference: Any = None
    video_reference: Any = None
    audio_reference: Any = None
    quality: str | None = None
    user: str | None = None
    # Extension: keep an MP4 of exactly the frames sent.
    record: bool = False

    @field_validator("size")
    @classmethod
    def _check_size(cls, value: str | None) -> str | None:
        if value is not None and not _SIZE.match(value):
            raise ValueError("size must be 'WIDTHxHEIGHT', e.g. '832x480'")
        return value

    def resolve_video_params(self) -> VideoParams:
        """The reference's rules: top level beats video_params, size beats both, fps defaults to 24,
        num_frames falls back to seconds x fps."""
        nested = self.video_params or VideoParams()
        width = self.width if self.width is not None else nested.width
        height = self.height if self.height is not None else nested.height
        if self.size is not None:
            match = _SIZE.match(self.size)
            assert match is not None
            width, height = int(match.group(1)), int(match.group(2))
        fps = self.fps if self.fps is not None else nested.fps
        fps = fps if fps is not None else DEFAULT_FPS
        num_frames = self.num_frames if self.num_frames is not None else nested.num_frames
        if num_frames is None and self.seconds is not None:
            num_frames = int(self.seconds) * fps
        return VideoParams(width=width, height=height, num_frames=num_frames, fps=fps)


MAX_VIDEO_SIDE = 16383  # VP8's largest frame; H.264 levels stop well below it


def video_limit_problem(
    width: int, height: int, fps: int, num_frames: int, max_pixels: int, max_fps: int, max_frames: int
) -> str | None:
    """Why a resolved generation is larger than this server generates (its settings), or None."""
    if width > MAX_VIDEO_SIDE or height > MAX_VIDEO_SIDE:
        return f"size {width}x{height} has a side over {MAX_VIDEO_SIDE} pixels"
    if width * height > max_pixels:
        return f"size {width}x{height} is over this server's {max_pixels} pixels per frame (--max-video-pixels)"
    if fps > max_fps:
        return f"fps {fps} is over this server's {max_fps} (--max-video-fps)"
    if num_frames > max_frames:
        return f"num_frames {num_frames} is over this server's {max_frames} (--max-video-frames)"
    return None


def coerce_start_fields(msg: dict[str, Any]) -> dict[str, Any]:
    """Lift `sampling_params` as the reference does: request fields not given at top level move
    up; everything else merges into `extra_params`."""
    data = {k: v for k, v in msg.items() if k not in {"type", "format", "sampling_params"}}
    sampling = msg.get("sampling_params")
    if isinstance(sampling, dict):
        extra = dict(data.get("extra_params") or {})
        for key, value in sampling.items():
            if key in VideoGenerationRequest.model_fields and key not in data:
                data[key] = value
            else:
                extra[key] = value
        if extra:
            data["extra_params"] = extra
    return data


class InteractionEvent(BaseModel):
    model_config = ConfigDict(extra="forbid")
    prompt: str


class Interaction(BaseModel):
    event_id: str | None = None
    event: InteractionEvent
    transition_chunks: int | None = Field(None, ge=0)


# ----------------------------------------------------------------- client messages


class StartMessage(TypedMessage):
    """`session.start`: the request, or the error it earns (the format is checked first, as upstream)."""

    type: Literal["session.start"]
    request: VideoGenerationRequest | None = None
    invalid: str = ""  # the error to send when the model above is None

    @model_validator(mode="before")
    @classmethod
    def _parse_request(cls, data: dict[str, Any]) -> dict[str, Any]:
        if data.get("format", "m4s") != "m4s":  # fMP4 is meaningless over RTP, but only "m4s" is valid upstream
            return {"type": "session.start", "invalid": INVALID_FORMAT}
        fields = coerce_start_fields(data)
        return parsed_or_invalid("session.start", "request", VideoGenerationRequest, fields, invalid_start_error)


class InteractionMessage(TypedMessage):
    """`session.interaction`: a prompt change, or why it is invalid."""

    type: Literal["session.interaction"]
    interaction: Interaction | None = None
    invalid: str = ""  # the error to send when the model above is None

    @model_validator(mode="before")
    @classmethod
    def _parse_interaction(cls, data: dict[str, Any]) -> dict[str, Any]:
        return parsed_or_invalid(
            "session.interaction", "interaction", Interaction, data.get("interaction"), invalid_interaction_error
        )


class StopMessage(TypedMessage):
    type: Literal["session.stop"]


class PingMessage(TypedMessage):
    type: Literal["session.ping"]


class PromptUpdateMessage(TypedMessage):
    type: Literal["session.prompt_update"]


ClientMessage = StartMessage | InteractionMessage | StopMessage | PingMessage | PromptUpdateMessage | UnknownMessage
_PARSER = message_parser(ClientMessage)


def decode(raw: str, *, awaiting_start: bool) -> ClientMessage | Refusal:
    """One client message, typed, or refused as the reference refuses it. Before `session.start`,
    every refusal ends the reference's session."""
    if len(raw.encode()) > (MAX_START_MESSAGE_BYTES if awaiting_start else MAX_CONTROL_MESSAGE_BYTES):
        return Refusal.first_or_later(awaiting_start, START_TOO_LARGE, CONTROL_TOO_LARGE)
    return decode_message(
        raw,
        _PARSER,
        invalid_json=Refusal.first_or_later(awaiting_start, INVALID_JSON_IN_START, INVALID_JSON_MESSAGE),
        not_an_object=lambda _v: Refusal.first_or_later(awaiting_start, START_NOT_AN_OBJECT, CONTROL_NOT_AN_OBJECT),
    )


BINARY_REFUSAL = Refusal(BINARY_NOT_SUPPORTED)


# ----------------------------------------------------------------- server events


class VideoStart(ServerEvent):
    type: ClassVar[str] = "video.start"
    request_id: str
    format: str = "m4s"
    config: dict[str, Any]

    def to_wire(self) -> dict[str, Any]:
        return {"type": self.type, **self.model_dump(mode="json")}


# An interaction report's event ids; vLLM-Omni's may be missing or null, which means none.
EventIds = Annotated[list[str], BeforeValidator(lambda ids: ids or [])]


class VideoChunkMetadata(ServerEvent):
    """Ours always carry every field; vLLM-Omni's have no frame indices, and no chunk index (null)
    from a model served without streaming output."""

    type: ClassVar[str] = "video.chunk_metadata"
    request_id: str
    kind: str = "media"
    num_frames: int
    generation_chunk_index: int | None = None
    first_frame_index: int | None = None
    last_frame_index: int | None = None
    started_event_ids: EventIds = Field(default_factory=list)
    active_event_ids: EventIds = Field(default_factory=list)
    completed_event_ids: EventIds = Field(default_factory=list)

    def to_wire(self) -> dict[str, Any]:
        return {"type": self.type, **self.model_dump(mode="json")}


class GenerationDone(ServerEvent):
    type: ClassVar[str] = "session.done"
    request_id: str
    chunks: int
    frames: int | None = None  # ours count them; vLLM-Omni's do not
    stopped: bool
    recording: str | None = None  # our extension: where the `record: true` MP4 is fetched (RECORDING_PATH)


class SessionPong(ServerEvent):
    type: ClassVar[str] = "session.pong"


class InteractionQueued(ServerEvent):
    type: ClassVar[str] = "session.interaction.queued"
    request_id: str
    event_id: str
    apply_from_chunk: int | None = None  # ours say when it applies; vLLM-Omni's do not


class GenerateError(ServerEvent):
    type: ClassVar[str] = "error"
    message: str
    code: str | None = None
    request_id: str | None = None
    event_id: str | None = None

    @property
    def error_message(self) -> str | None:
        return self.message


# The events vLLM-Omni's handler sends, by `type` (binary fMP4 chunks aside).
SERVER_EVENTS: dict[str, type[ServerEvent]] = {
    event.type: event
    for event in (VideoStart, VideoChunkMetadata, GenerationDone, SessionPong, InteractionQueued, GenerateError)
}


def decode_server_event(raw: str) -> DecodedEvent:
    """One event from an upstream `/v1/realtime/video` server, typed once as it arrives."""
    return decode_event(raw, SERVER_EVENTS)
