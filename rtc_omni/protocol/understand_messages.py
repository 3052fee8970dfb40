"""Messages of an understanding session: vLLM-Omni's `/v1/video/chat/stream` protocol plus our extensions.

`decode` parses each client message once into one model of the `ClientMessage` union, leniently
where the reference is lenient (a `video.frame` keeps whatever `frame_id` it carries, undecodable
audio is dropped), or refuses it with the reference's error string. Server events are pydantic
models serialised with `to_wire()`, which keeps explicitly passed nulls (the reference echoes them)
and drops optional fields that were never set.
"""

from __future__ import annotations

import base64
import binascii
import time
from typing import Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from .codec import (
    BINARY_NOT_SUPPORTED,
    DecodedEvent,
    IdleTimeoutMs,
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

WEBSOCKET_PATH = "/v1/video/chat/stream"

# vLLM-Omni's own error strings, kept verbatim: its clients match them (docs/protocol.md lists them).
TIMEOUT_WAITING_FOR_CONFIG = "Timeout waiting for session.config"
INVALID_JSON_IN_CONFIG = "Invalid JSON in session.config"
INVALID_JSON = "Invalid JSON"
NOT_AN_OBJECT = "Messages must be JSON objects"
FRAME_TOO_LARGE = "Frame too large"
INVALID_IMAGE_DATA = "Invalid image data"
AUDIO_BUFFER_OVERFLOW = "Audio buffer overflow"
NO_FRAMES_BUFFERED = "No frames buffered"
QUERY_PROCESSING_FAILED = "Query processing failed"
IDLE_TIMEOUT = "Idle timeout"
NOT_AVAILABLE = "Streaming video chat is not available"  # a server without this endpoint
# Our own, in the same style (and those both protocols share, in codec.py).
CONFIG_ALREADY_APPLIED = "session.config was already applied"
ENGINE_STALLED = "Engine stall timeout: no output"
NO_ACTIVE_RESPONSE = "No active response to cancel"
SEMANTIC_VAD_UNAVAILABLE = "Semantic turn detection is not available"
SEMANTIC_VAD_HINT = (
    "The end-of-turn model is not installed on this server (pip install 'rtc-omni[turn]'): turn_detection is "
    "server_vad, its silence taken from the eagerness"
)
NOISE_REDUCTION_UNAVAILABLE = "Noise reduction is not available"
NOISE_REDUCTION_HINT = (
    "RNNoise is not installed on this server (pip install 'rtc-omni[denoise]'): the audio is not cleaned"
)


def expected_config_error(got: Any) -> str:
    return f"Expected session.config, got: {shortened(got)}"


def invalid_config_error(details: str) -> str:
    return f"Invalid session config: {details}"


def unknown_type_error(msg_type: Any) -> str:
    return f"Unknown type: {shortened(msg_type)}"


_LEGACY_ALIASES = {
    "num_sample_frames": "num_frames",
    "evs_enabled": "enable_frame_filter",
    "evs_threshold": "frame_filter_threshold",
}


class TurnDetection(BaseModel):
    """`session.config.turn_detection`: server VAD, or semantic turn detection with its `eagerness`,
    with OpenAI Realtime's names and defaults."""

    model_config = ConfigDict(extra="forbid")

    type: Literal["server_vad", "semantic_vad"] = "server_vad"
    threshold: float = Field(0.5, ge=0.0, le=1.0)
    prefix_padding_ms: int = Field(300, ge=0, le=5000)
    silence_duration_ms: int = Field(500, ge=100, le=10_000)
    interrupt_response: bool = True
    eagerness: Literal["low", "medium", "high", "auto"] = "auto"
    # Voice over an answer for this long cancels it; shorter, the answer resumes (None: --min-interruption-ms).
    min_interruption_ms: int | None = Field(None, ge=0, le=5000)
    idle_timeout_ms: IdleTimeoutMs | None = None  # prompt a silent user (docs/turn-taking.md)


class NoiseReduction(BaseModel):
    """`session.config.noise_reduction`: RNNoise on the microphone, with OpenAI Realtime's names."""

    model_config = ConfigDict(extra="forbid")

    type: Literal["near_field", "far_field"] = "near_field"
    strength: float = Field(1.0, ge=0.0, le=1.0)


class SessionConfig(BaseModel):
    """`session.config`: the reference's StreamingVideoSessionConfig plus `sample_fps` and `audio_events`."""

    model_config = ConfigDict(extra="ignore")

    model: str | None = None
    modalities: list[str] = Field(default_factory=lambda: ["text", "audio"])
    num_frames: int = Field(4, ge=1, le=128)
    max_frames: int = Field(50, ge=1, le=256)
    system_prompt: str | None = None
    use_audio_in_video: bool = True
    sampling_params_list: list[dict[str, Any]] | None = None
    enable_frame_filter: bool = True
    frame_filter_threshold: float = Field(0.95, ge=0.0, le=1.0)
    sample_fps: float = Field(2.0, gt=0.0, le=60.0)
    audio_events: bool = False
    turn_detection: TurnDetection | None = None
    noise_reduction: NoiseReduction | None = None

    @model_validator(mode="before")
    @classmethod
    def _apply_legacy_aliases(cls, data: Any) -> Any:
        if isinstance(data, dict):
            data = dict(data)
            for old, new in _LEGACY_ALIASES.items():
                if old in data and new not in data:
                    data[new] = data.pop(old)
        return data

    @property
    def track_filter_threshold(self) -> float | None:
        """The EVS threshold for camera-track frames if the client set one (else the camera path's)."""
        return self.frame_filter_threshold if "frame_filter_threshold" in self.model_fields_set else None


# ----------------------------------------------------------------- client messages

INTERNAL_PREFIX = "_internal."  # the reference reserves these types for its own queue


def _lenient_pcm(data: Any) -> bytes:
    """Base64 PCM decoded as the reference does: leniently, and b"" for what still fails."""
    if not isinstance(data, str) or not data:
        return b""
    try:
        return base64.b64decode(data)
    except (binascii.Error, ValueError):
        return b""


class ConfigMessage(TypedMessage):
    """`session.config`: the config, or the error its fields earn (sent in turn, after the
    check that no config was applied yet)."""

    type: Literal["session.config"]
    config: SessionConfig | None = None
    invalid: str = ""  # the error to send when the model above is None

    @model_validator(mode="before")
    @classmethod
    def _parse_config(cls, data: dict[str, Any]) -> dict[str, Any]:
        fields = {k: v for k, v in data.items() if k != "type"}
        return parsed_or_invalid("session.config", "config", SessionConfig, fields, invalid_config_error)


class FrameMessage(TypedMessage):
    """`video.frame`: a base64 image, and the metadata the reference echoes without checking it."""

    type: Literal["video.frame"]
    data: str | None  # "" when empty or missing (ignored, as upstream); None when not a string
    frame_id: Any = None
    pts_ms: Any = None
    source_pts_ms: Any = None
    quality_profile: Any = None
    capture_ts_ms: Any = None
    received_ts_ms: float  # when the reader took the message (monotonic ms)

    @model_validator(mode="before")
    @classmethod
    def _stamp(cls, data: dict[str, Any]) -> dict[str, Any]:
        image = data.get("data")
        return {
            "type": "video.frame",
            "data": "" if not image else image if isinstance(image, str) else None,
            **{name: data.get(name) for name in ECHOED_FRAME_FIELDS},
            "received_ts_ms": time.monotonic() * 1000.0,
        }

    def echoed(self) -> dict[str, Any]:
        """The metadata the reference keeps with the frame and echoes back, by name."""
        return {name: getattr(self, name) for name in ECHOED_FRAME_FIELDS}


ECHOED_FRAME_FIELDS = ("frame_id", "pts_ms", "source_pts_ms", "quality_profile", "capture_ts_ms")


class AudioMessage(TypedMessage):
    """`audio.chunk`: 16 kHz mono PCM16."""

    type: Literal["audio.chunk"]
    pcm: bytes  # b"" when missing or undecodable (dropped silently, as upstream)

    @model_validator(mode="before")
    @classmethod
    def _decode(cls, data: dict[str, Any]) -> dict[str, Any]:
        return {"type": "audio.chunk", "pcm": _lenient_pcm(data.get("data"))}


class QueryMessage(TypedMessage):
    """`video.query`: a question about the buffered frames, with optional audio to buffer first."""

    type: Literal["video.query"]
    text: str  # any other JSON value is taken as its str(), as upstream's f-strings would
    pcm: bytes  # `audio_data`, decoded as `audio.chunk`'s

    @model_validator(mode="before")
    @classmethod
    def _decode(cls, data: dict[str, Any]) -> dict[str, Any]:
        text = data.get("text", "")
        return {
            "type": "video.query",
            "text": text if isinstance(text, str) else str(text),
            "pcm": _lenient_pcm(data.get("audio_data")),
        }


class DoneMessage(TypedMessage):
    type: Literal["video.done"]


class CancelMessage(TypedMessage):
    type: Literal["response.cancel"]


class PingMessage(TypedMessage):
    type: Literal["ping"]


ClientMessage = (
    ConfigMessage
    | FrameMessage
    | AudioMessage
    | QueryMessage
    | DoneMessage
    | CancelMessage
    | PingMessage
    | UnknownMessage
)
_PARSER = message_parser(ClientMessage)


def _refuse_reserved(value: dict[str, Any]) -> Refusal | None:
    """The reference's reader refuses the types reserved for its own queue at once."""
    msg_type = value.get("type")
    if isinstance(msg_type, str) and msg_type.startswith(INTERNAL_PREFIX):
        return Refusal(unknown_type_error(msg_type))
    return None


def decode(raw: str, *, awaiting_config: bool) -> ClientMessage | Refusal:
    """One client message, typed, or refused as the reference's reader refuses it. Before the
    config, what is not a JSON object ends the reference's session."""
    return decode_message(
        raw,
        _PARSER,
        invalid_json=Refusal.first_or_later(awaiting_config, INVALID_JSON_IN_CONFIG, INVALID_JSON),
        not_an_object=lambda v: Refusal.first_or_later(
            awaiting_config, expected_config_error(type(v).__name__), NOT_AN_OBJECT
        ),
        screen=_refuse_reserved,
    )


# The reference's reader fails on a binary message, which ends its session.
BINARY_REFUSAL = Refusal(BINARY_NOT_SUPPORTED, ends_reference_session=True)


# ----------------------------------------------------------------- server events


class FrameAck(ServerEvent):
    type: ClassVar[str] = "video.frame.ack"
    frame_id: str
    pts_ms: Any
    capture_ts_ms: Any
    accepted: bool
    buffered_frames: int
    server_receive_ts_ms: float
    reason: Literal["filtered"] | None = None
    dropped_frame_id: str | None = None


class ConsumedFrame(BaseModel):
    frame_id: Any
    pts_ms: Any
    source_pts_ms: Any
    quality_profile: Any
    receiver_received_ts_ms: float | None
    decoded_ready_ts_ms: float | None


class FramesConsumed(ServerEvent):
    type: ClassVar[str] = "video.frames.consumed"
    request_id: str
    model_selected_ts_ms: float
    frame_ids: list[str]
    frames: list[ConsumedFrame]
    latest_pts_ms: Any


# vLLM-Omni's `response.*` events carry no request_id (its quirk); ours always do.


class ResponseStart(ServerEvent):
    type: ClassVar[str] = "response.start"
    request_id: str | None = None


class TextDeltaEvent(ServerEvent):
    type: ClassVar[str] = "response.text.delta"
    request_id: str | None = None
    delta: str


class TextDone(ServerEvent):
    type: ClassVar[str] = "response.text.done"
    request_id: str | None = None
    text: str


class AudioDeltaEvent(ServerEvent):
    type: ClassVar[str] = "response.audio.delta"
    request_id: str | None = None
    data: str
    format: Literal["wav"] = "wav"

    def to_wire(self) -> dict[str, Any]:
        return {"type": self.type, **self.model_dump(mode="json")}


class AudioDone(ServerEvent):
    type: ClassVar[str] = "response.audio.done"
    request_id: str | None = None


class ResponseCancelled(ServerEvent):
    type: ClassVar[str] = "response.cancelled"
    request_id: str


class SpeechStartedEvent(ServerEvent):
    type: ClassVar[str] = "input_audio.speech_started"
    audio_start_ms: float


class TimeoutTriggeredEvent(ServerEvent):
    """Nobody spoke for `turn_detection.idle_timeout_ms`: a turn starts with that silence as its audio."""

    type: ClassVar[str] = "input_audio.timeout_triggered"
    audio_start_ms: float
    audio_end_ms: float


class SpeechStoppedEvent(ServerEvent):
    type: ClassVar[str] = "input_audio.speech_stopped"
    audio_end_ms: float


class ContextLost(ServerEvent):
    """Extension: the model no longer remembers earlier turns (a remote upstream was replaced)."""

    type: ClassVar[str] = "session.context_lost"
    request_id: str  # the turn that is answered without them
    message: str


class SessionDone(ServerEvent):
    type: ClassVar[str] = "session.done"


class Pong(ServerEvent):
    type: ClassVar[str] = "pong"


class ErrorEvent(ServerEvent):
    type: ClassVar[str] = "error"
    message: str
    request_id: str | None = None
    detail: str | None = None  # extension: why, when the reference string alone says too little
    code: str | None = None  # extension: a name a client can test, OpenAI's where it has one

    @property
    def error_message(self) -> str | None:
        return self.message


# The events vLLM-Omni's handler sends, by `type`; from 0.30 it names its audio events `output_audio`.
SERVER_EVENTS: dict[str, type[ServerEvent]] = {
    **{
        event.type: event
        for event in (
            FrameAck,
            FramesConsumed,
            ResponseStart,
            TextDeltaEvent,
            TextDone,
            AudioDeltaEvent,
            AudioDone,
            SessionDone,
            Pong,
            ErrorEvent,
        )
    },
    "response.output_audio.delta": AudioDeltaEvent,
    "response.output_audio.done": AudioDone,
}


def decode_server_event(raw: str) -> DecodedEvent:
    """One event from an upstream `/v1/video/chat/stream` server, typed once as it arrives."""
    return decode_event(raw, SERVER_EVENTS)
