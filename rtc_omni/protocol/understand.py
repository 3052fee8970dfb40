"""Messages of an understanding session: vLLM-Omni's `/v1/video/chat/stream` protocol plus our extensions.

Client messages are parsed leniently where the reference is lenient (a `video.frame` keeps whatever
`frame_id` it carries); server events are pydantic models serialised with `to_wire()`, which keeps
explicitly passed nulls (the reference echoes them) and drops optional fields that were never set.
"""

from __future__ import annotations

from typing import Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

WEBSOCKET_PATH = "/v1/video/chat/stream"

# Reference error strings (protocol section 2.5), kept verbatim so clients can match them.
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
# Our own, in the same style.
BINARY_NOT_SUPPORTED = "Binary messages are not supported; send JSON text"
MESSAGE_QUEUE_FULL = "Message queue full; message dropped"
CONFIG_ALREADY_APPLIED = "session.config was already applied"
ENGINE_STALLED = "Engine stall timeout: no output"
NO_ACTIVE_RESPONSE = "No active response to cancel"


def expected_config_error(got: Any) -> str:
    return f"Expected session.config, got: {got}"


def invalid_config_error(details: str) -> str:
    return f"Invalid session config: {details}"


def unknown_type_error(msg_type: Any) -> str:
    return f"Unknown type: {msg_type}"


MAX_AUDIO_BUFFER_BYTES = 4 * 1024 * 1024
AUDIO_SAMPLE_RATE = 16_000

_LEGACY_ALIASES = {
    "num_sample_frames": "num_frames",
    "evs_enabled": "enable_frame_filter",
    "evs_threshold": "frame_filter_threshold",
}


class TurnDetection(BaseModel):
    """`session.config.turn_detection`: server VAD, with OpenAI Realtime's names and defaults."""

    model_config = ConfigDict(extra="forbid")

    type: Literal["server_vad"] = "server_vad"
    threshold: float = Field(0.5, ge=0.0, le=1.0)
    prefix_padding_ms: int = Field(300, ge=0, le=5000)
    silence_duration_ms: int = Field(500, ge=100, le=10_000)
    interrupt_response: bool = True


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

    # EVS threshold applied to camera-track frames when the client did not choose one. 0.95 keeps a
    # frame only when its RMS difference exceeds ~57 of 255, which freezes a quiet webcam scene; 0.99
    # (RMS > ~25) still drops a static camera but follows a person moving.
    TRACK_DEFAULT_FILTER_THRESHOLD: ClassVar[float] = 0.99

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
    def track_filter_threshold(self) -> float:
        """The EVS threshold for camera-track frames: the client's if it set one, else ours."""
        if "frame_filter_threshold" in self.model_fields_set:
            return self.frame_filter_threshold
        return self.TRACK_DEFAULT_FILTER_THRESHOLD


class ServerEvent(BaseModel):
    """Base of every server -> client message."""

    type: ClassVar[str]

    def to_wire(self) -> dict[str, Any]:
        return {"type": self.type, **self.model_dump(mode="json", exclude_unset=True)}


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


class ResponseStart(ServerEvent):
    type: ClassVar[str] = "response.start"
    request_id: str


class TextDeltaEvent(ServerEvent):
    type: ClassVar[str] = "response.text.delta"
    request_id: str
    delta: str


class TextDone(ServerEvent):
    type: ClassVar[str] = "response.text.done"
    request_id: str
    text: str


class AudioDeltaEvent(ServerEvent):
    type: ClassVar[str] = "response.audio.delta"
    request_id: str
    data: str
    format: Literal["wav"] = "wav"

    def to_wire(self) -> dict[str, Any]:
        return {"type": self.type, **self.model_dump(mode="json")}


class AudioDone(ServerEvent):
    type: ClassVar[str] = "response.audio.done"
    request_id: str


class ResponseCancelled(ServerEvent):
    type: ClassVar[str] = "response.cancelled"
    request_id: str


class SpeechStartedEvent(ServerEvent):
    type: ClassVar[str] = "input_audio.speech_started"
    audio_start_ms: float


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
