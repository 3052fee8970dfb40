"""The OpenAI Realtime API's events (GA names, as `openai` 3.51's `openai.types.realtime` has them).

Client events are parsed once, here, into our own models: base64 audio and data-URL images are
decoded at the boundary, and a malformed event becomes an `InvalidEvent` that the session answers
in turn with an `error` carrying the client's `event_id`. Server events are `RealtimeEvent`s, each
with a fresh `event_id`; conversation items and responses travel as plain dicts in OpenAI's shape.
"""

from __future__ import annotations

import base64
import binascii
import json
import re
import uuid
from typing import Annotated, Any, ClassVar, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    StrictStr,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

from .codec import (
    IdleTimeoutMs,
    NestedTooDeep,
    Refusal,
    ServerEvent,
    TypedMessage,
    UnknownMessage,
    load_json,
    message_parser,
)
from .validation import describe_validation_error, field_path, quoted, shortened

WEBSOCKET_PATH = "/v1/realtime"
PCM_RATE = 24_000  # audio/pcm, in and out
MAX_ITEM_ID_CHARS = 64
MAX_CONTENT_PARTS = 32
MAX_INSTRUCTIONS_CHARS = 64 * 1024
MAX_EVENT_ID_CHARS = 512
MAX_TOOLS = 128
MAX_TOOL_NAME_CHARS = 64
MAX_TOOL_DESCRIPTION_CHARS = 16 * 1024
MAX_FUNCTION_TEXT_CHARS = 512 * 1024  # a call's arguments or a tool's output, as text
MAX_CALL_ID_CHARS = 64
MAX_RESPONSE_INPUT_ITEMS = 64
MAX_METADATA_PAIRS = 16
MAX_METADATA_KEY_CHARS = 64
MAX_METADATA_VALUE_CHARS = 512
# The session's fields other than `instructions`, as JSON: room for what the SDK and agent frameworks
# pass through (tools with their schemas, tracing, prompt, voice), which is kept and reported back.
MAX_SESSION_PASS_THROUGH_BYTES = 256 * 1024

# Error types and codes, as OpenAI names them where it has a name.
INVALID_REQUEST = "invalid_request_error"
SERVER_ERROR = "server_error"

INVALID_JSON = "Invalid JSON: the event must be one JSON object"
NOT_AN_OBJECT = "Invalid event: expected a JSON object with a 'type'"
BINARY_REFUSAL = Refusal("Binary messages are not supported; send JSON text events")
MESSAGE_QUEUE_FULL_CODE = "rate_limit_exceeded"
IDLE_TIMEOUT = "Session closed: no client event within the idle timeout"
ENGINE_STALLED = "The engine stopped producing output"
RESPONSE_FAILED = "The response failed"
ACTIVE_RESPONSE = "Conversation already has an active response in progress"
NO_ACTIVE_RESPONSE = "Cancellation failed: no active response found"
AUDIO_BUFFER_EMPTY = "Error committing input audio buffer: the buffer is empty"
AUDIO_BUFFER_OVERFLOW = "Input audio buffer overflow: the buffered audio was dropped"
TRANSCRIPTION_UNAVAILABLE = (
    "Input transcription is not available on this server (no recogniser for its engine): "
    "audio.input.transcription is off, and audio items keep no transcript. With the synthetic engine, "
    "install the recogniser (pip install 'rtc-omni[transcribe]') and restart the server"
)
SEMANTIC_VAD_UNAVAILABLE = (
    "Semantic turn detection is not available on this server (no end-of-turn model): turn_detection is "
    "server_vad, its silence taken from the eagerness. Install the model (pip install 'rtc-omni[turn]') "
    "and restart the server"
)
NOISE_REDUCTION_UNAVAILABLE = (
    "Noise reduction is not available on this server (RNNoise is not installed): "
    "audio.input.noise_reduction is off. Install it (pip install 'rtc-omni[denoise]') and restart the server"
)
TRANSCRIPTION_BACKLOG = "Input transcription is behind: too many committed audio items are waiting"
OUTPUT_AUDIO_CLEAR_WEBRTC_ONLY = "output_audio_buffer.clear is for WebRTC calls; over WebSocket send response.cancel"
TOOLS_UNAVAILABLE = (
    "Function calling is not available with this server's engine (a remote vLLM-Omni upstream takes "
    "no tools): session.tools is empty, and responses call nothing"
)
PARALLEL_RESPONSES = "Too many out-of-band responses in progress at once"


CALL_UNKNOWN = "No function_call with call_id '{call_id}' in the conversation"
CALL_ANSWERED = "The function_call with call_id '{call_id}' already has an output"
CALL_EXISTS = "A function_call with call_id '{call_id}' is already in the conversation"


def about_call(problem: str, call_id: str) -> str:
    """CALL_UNKNOWN, CALL_ANSWERED or CALL_EXISTS about the client's `call_id`, shortened."""
    return problem.format(call_id=shortened(call_id))


def new_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex[:20]}"


def item_not_found(item_id: str) -> str:
    return f"Item with item_id '{shortened(item_id)}' not found in the conversation"


def previous_item_not_found(item_id: str) -> str:
    return f"Previous item with item_id '{shortened(item_id)}' not found in the conversation"


def item_exists(item_id: str) -> str:
    return f"Item with item_id '{shortened(item_id)}' already exists"


def unknown_event(msg_type: Any) -> str:
    return f"Invalid value: {quoted(msg_type)}. Supported values are the client events listed in docs/realtime.md"


# ----------------------------------------------------------------------------- session config


def _unset(value: Any) -> bool:
    return value is None


# A field of OpenAI's session object that the engine does not act on: kept as sent and reported back
# (not when unset), within MAX_SESSION_PASS_THROUGH_BYTES; its shape is the client's business.
PassedThrough = Annotated[Any, Field(exclude_if=_unset)]


class Known(BaseModel):
    """An object of OpenAI's, as the `openai` SDK defines it (RealtimeSessionCreateRequest and its parts,
    a response's params): its fields are kept, any other key is dropped, so what is kept stays bounded."""

    model_config = ConfigDict(extra="ignore")


class AudioFormat(Known):
    type: Literal["audio/pcm"] = "audio/pcm"
    rate: Literal[24000] = 24000  # PCM_RATE


class TurnDetectionConfig(Known):
    """Server VAD with OpenAI's names and defaults; `semantic_vad` adds the end-of-turn model, its
    eagerness setting how soon a pause ends the turn (sessions/end_of_turn.py). `idle_timeout_ms`
    prompts a silent user (both types: OpenAI offers it with `server_vad` only)."""

    type: Literal["server_vad", "semantic_vad"]
    threshold: float = Field(0.5, ge=0.0, le=1.0)
    prefix_padding_ms: int = Field(300, ge=0, le=5000)
    silence_duration_ms: int = Field(500, ge=100, le=10_000)
    create_response: bool = True
    interrupt_response: bool = True
    eagerness: Literal["low", "medium", "high", "auto"] = "auto"
    idle_timeout_ms: Annotated[IdleTimeoutMs | None, Field(exclude_if=_unset)] = None


class NoiseReductionConfig(Known):
    """`audio.input.noise_reduction`: RNNoise on the microphone before everything else hears it; both
    types run the same model (docs/turn-taking.md). `strength` 1 is RNNoise alone, lower keeps some
    of the input."""

    type: Literal["near_field", "far_field"] = "near_field"
    strength: float = Field(1.0, ge=0.0, le=1.0)


class TranscriptionConfig(Known):
    """`audio.input.transcription`: its `language` is a hint to the recogniser; the rest is reported back."""

    language: Annotated[str | None, Field(exclude_if=_unset)] = None
    model: PassedThrough = None
    prompt: PassedThrough = None
    delay: PassedThrough = None
    keywords: PassedThrough = None
    languages: PassedThrough = None


class AudioInputConfig(Known):
    format: AudioFormat = Field(default_factory=AudioFormat)
    turn_detection: TurnDetectionConfig | None = None
    transcription: TranscriptionConfig | None = None
    noise_reduction: NoiseReductionConfig | None = None


class AudioOutputConfig(Known):
    format: AudioFormat = Field(default_factory=AudioFormat)
    voice: PassedThrough = None
    speed: PassedThrough = None


class AudioConfig(Known):
    input: AudioInputConfig = Field(default_factory=AudioInputConfig)
    output: AudioOutputConfig = Field(default_factory=AudioOutputConfig)


_TOOL_NAME = r"^[A-Za-z0-9_-]+$"


class FunctionToolIn(Known):
    """A function the model may call, as `session.tools` / `response.tools` declare it."""

    type: Literal["function"] = "function"
    name: str = Field(min_length=1, max_length=MAX_TOOL_NAME_CHARS, pattern=_TOOL_NAME)
    description: str = Field("", max_length=MAX_TOOL_DESCRIPTION_CHARS)
    parameters: dict[str, Any] = Field(default_factory=lambda: {"type": "object", "properties": {}})

    @field_validator("parameters")
    @classmethod
    def _object_schema(cls, value: dict[str, Any]) -> dict[str, Any]:
        """A JSON Schema of the arguments object: the model's answer is one JSON object."""
        if value.get("type", "object") != "object":
            raise ValueError("must be a JSON Schema with type 'object' (a call's arguments are one JSON object)")
        if not isinstance(value.get("properties", {}), dict):
            raise ValueError("'properties' must be an object of JSON Schemas")
        required = value.get("required", [])
        if not isinstance(required, list) or not all(isinstance(name, str) for name in required):
            raise ValueError("'required' must be a list of property names")
        return value


class ToolChoiceFunction(Known):
    type: Literal["function"]
    name: str = Field(min_length=1, max_length=MAX_TOOL_NAME_CHARS)


def _distinct_names(tools: list[FunctionToolIn] | None) -> list[FunctionToolIn] | None:
    if tools is not None and len({tool.name for tool in tools}) != len(tools):
        raise ValueError("tools must have different names")
    return tools


ToolChoiceIn = Literal["auto", "none", "required"] | ToolChoiceFunction
Tools = Annotated[list[FunctionToolIn], Field(max_length=MAX_TOOLS), AfterValidator(_distinct_names)]


def choice_problem(tools: list[FunctionToolIn], choice: ToolChoiceIn) -> str | None:
    """Why `choice` cannot be made among `tools`: a named tool must be one of them, and `required`
    needs one to call."""
    if isinstance(choice, ToolChoiceFunction) and choice.name not in {tool.name for tool in tools}:
        return f"names {quoted(choice.name)}, which is not among the tools"
    if choice == "required" and not tools:
        return "'required' needs at least one tool"
    return None


Modality = Literal["text", "audio"]
Modalities = Annotated[list[Modality], Field(min_length=1, max_length=1)]


def _audio_only() -> list[Modality]:
    return ["audio"]


class SessionConfig(Known):
    """The realtime session as `session.created` / `session.updated` report it."""

    type: Literal["realtime"] = "realtime"
    model: str | None = None
    instructions: str = Field("", max_length=MAX_INSTRUCTIONS_CHARS)
    output_modalities: Modalities = Field(default_factory=_audio_only)
    audio: AudioConfig = Field(default_factory=AudioConfig)
    include: PassedThrough = None
    max_output_tokens: PassedThrough = None
    parallel_tool_calls: PassedThrough = None
    prompt: PassedThrough = None
    reasoning: PassedThrough = None
    tools: Tools = Field(default_factory=list)
    tool_choice: ToolChoiceIn = "auto"  # after tools: it is checked against them
    tracing: PassedThrough = None
    truncation: PassedThrough = None

    @field_validator("tool_choice")
    @classmethod
    def _choice_fits(cls, choice: ToolChoiceIn, info: ValidationInfo) -> ToolChoiceIn:
        problem = choice_problem(info.data.get("tools", []), choice)
        if problem is not None:
            raise ValueError(problem)
        return choice

    @model_validator(mode="after")
    def _bounded(self) -> SessionConfig:
        size = len(json.dumps(self.model_dump(mode="json", exclude={"instructions"})))
        if size > MAX_SESSION_PASS_THROUGH_BYTES:
            raise ValueError(
                f"its fields other than instructions hold {size} bytes of JSON, over this server's "
                f"{MAX_SESSION_PASS_THROUGH_BYTES} (docs/realtime.md)"
            )
        return self

    def updated(self, changes: dict[str, Any]) -> SessionConfig:
        """This config with `changes` merged in (objects merge key by key); ValidationError if invalid."""
        return SessionConfig.model_validate(_merge(self.model_dump(mode="json"), changes))

    def to_wire(self) -> dict[str, Any]:
        return {"object": "realtime.session", **self.model_dump(mode="json")}


def _merge(base: dict[str, Any], changes: dict[str, Any]) -> dict[str, Any]:
    merged = dict(base)
    for key, value in changes.items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = _merge(merged[key], value)
        else:
            merged[key] = value
    return merged


# ----------------------------------------------------------------------------- conversation items

_DATA_URL = re.compile(r"data:image/(png|jpeg|jpg|webp);base64,(.*)", re.DOTALL)


def _b64(value: str) -> bytes:
    try:
        return base64.b64decode(value, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise ValueError("not valid base64") from exc


PartType = Literal["input_text", "input_audio", "input_image", "output_text", "output_audio"]
Role = Literal["user", "assistant", "system"]
ItemStatus = Literal["completed", "incomplete", "in_progress"]


class ContentPart(BaseModel):
    """One part of a message item; `audio` and `image_url` arrive decoded to bytes."""

    model_config = ConfigDict(extra="forbid")

    type: PartType
    text: str | None = None
    audio: bytes | None = None  # PCM16 mono 24 kHz
    transcript: str | None = None
    image_url: bytes | None = None  # the image file the data URL held
    detail: Literal["auto", "low", "high"] | None = None

    @field_validator("audio", mode="before")
    @classmethod
    def _audio(cls, value: Any) -> Any:
        return _b64(value) if isinstance(value, str) else value

    @field_validator("image_url", mode="before")
    @classmethod
    def _image(cls, value: Any) -> Any:
        if not isinstance(value, str):
            return value
        match = _DATA_URL.fullmatch(value)
        if match is None:
            raise ValueError("image_url must be a data URL (data:image/png;base64,... or image/jpeg)")
        return _b64(match.group(2))

    @model_validator(mode="after")
    def _filled(self) -> ContentPart:
        needed = {"input_text": "text", "output_text": "text", "input_audio": "audio", "input_image": "image_url"}
        field = needed.get(self.type)
        if field is not None and getattr(self, field) is None:
            raise ValueError(f"a {self.type} part needs '{field}'")
        if self.type == "output_audio" and self.transcript is None:
            raise ValueError("an output_audio part needs 'transcript' (its audio is not kept)")
        return self


_PARTS_BY_ROLE = {
    "user": {"input_text", "input_audio", "input_image"},
    "system": {"input_text"},
    "assistant": {"output_text", "output_audio"},
}


class ItemInBase(BaseModel):
    model_config = ConfigDict(extra="forbid")

    id: str | None = Field(None, min_length=1, max_length=MAX_ITEM_ID_CHARS)
    object: Literal["realtime.item"] | None = None
    status: ItemStatus | None = None


class MessageIn(ItemInBase):
    """A message item the client creates."""

    type: Literal["message"]
    role: Role
    content: list[ContentPart] = Field(min_length=1, max_length=MAX_CONTENT_PARTS)

    @model_validator(mode="after")
    def _parts_fit_role(self) -> MessageIn:
        wrong = [p.type for p in self.content if p.type not in _PARTS_BY_ROLE[self.role]]
        if wrong:
            raise ValueError(f"a {self.role} message cannot hold {', '.join(wrong)} parts")
        return self


CallId = Annotated[str, Field(min_length=1, max_length=MAX_CALL_ID_CHARS)]
FunctionText = Annotated[StrictStr, Field(max_length=MAX_FUNCTION_TEXT_CHARS)]


class FunctionCallIn(ItemInBase):
    """A call the model made, replayed into the conversation as history."""

    type: Literal["function_call"]
    call_id: CallId | None = None
    name: str = Field(min_length=1, max_length=MAX_TOOL_NAME_CHARS)
    arguments: FunctionText = ""


class FunctionCallOutputIn(ItemInBase):
    """What the app's tool returned for a call."""

    type: Literal["function_call_output"]
    call_id: CallId
    output: FunctionText


class ItemReference(BaseModel):
    """An item of the conversation, named in a response's `input`."""

    model_config = ConfigDict(extra="forbid")

    type: Literal["item_reference"]
    id: str = Field(min_length=1, max_length=MAX_ITEM_ID_CHARS)


ItemIn = Annotated[MessageIn | FunctionCallIn | FunctionCallOutputIn, Field(discriminator="type")]
InputItem = Annotated[MessageIn | FunctionCallIn | FunctionCallOutputIn | ItemReference, Field(discriminator="type")]
ITEM_TAGS = frozenset({"message", "function_call", "function_call_output", "item_reference"})


def without_tags(loc: tuple[int | str, ...]) -> tuple[int | str, ...]:
    """A field's location without the item-type tags pydantic puts in a discriminated union's path."""
    return tuple(part for part in loc if part not in ITEM_TAGS)


# ----------------------------------------------------------------------------- client events


class ClientEvent(TypedMessage):
    model_config = ConfigDict(extra="forbid")

    event_id: str | None = Field(None, max_length=MAX_EVENT_ID_CHARS)


class SessionUpdate(ClientEvent):
    type: Literal["session.update"]
    session: dict[str, Any]


class AudioAppend(ClientEvent):
    type: Literal["input_audio_buffer.append"]
    audio: bytes  # PCM16 mono 24 kHz

    @field_validator("audio", mode="before")
    @classmethod
    def _audio(cls, value: Any) -> Any:
        return _b64(value) if isinstance(value, str) else value

    @field_validator("audio")
    @classmethod
    def _whole_samples(cls, value: bytes) -> bytes:
        if len(value) % 2:
            raise ValueError("PCM16 audio must hold whole 2-byte samples")
        return value


class AudioCommit(ClientEvent):
    type: Literal["input_audio_buffer.commit"]


class AudioClear(ClientEvent):
    type: Literal["input_audio_buffer.clear"]


class ItemCreate(ClientEvent):
    type: Literal["conversation.item.create"]
    item: ItemIn
    previous_item_id: str | None = None


class ItemRetrieve(ClientEvent):
    type: Literal["conversation.item.retrieve"]
    item_id: str


class ItemDelete(ClientEvent):
    type: Literal["conversation.item.delete"]
    item_id: str


class ItemTruncate(ClientEvent):
    type: Literal["conversation.item.truncate"]
    item_id: str
    content_index: int = Field(ge=0)
    audio_end_ms: int = Field(ge=0)


def _metadata_bounded(value: dict[str, str] | None) -> dict[str, str] | None:
    if value is None:
        return None
    if len(value) > MAX_METADATA_PAIRS:
        raise ValueError(f"at most {MAX_METADATA_PAIRS} key-value pairs")
    for key, text in value.items():
        if len(key) > MAX_METADATA_KEY_CHARS or len(text) > MAX_METADATA_VALUE_CHARS:
            raise ValueError(f"keys are at most {MAX_METADATA_KEY_CHARS} characters, values {MAX_METADATA_VALUE_CHARS}")
    return value


Metadata = Annotated[dict[str, StrictStr] | None, AfterValidator(_metadata_bounded)]


class ResponseParams(Known):
    """`response.create`'s response: what differs from the session for this response only.
    `conversation: "none"` makes it out-of-band; `input` replaces the conversation as its context."""

    instructions: str | None = Field(None, max_length=MAX_INSTRUCTIONS_CHARS)
    output_modalities: Modalities | None = None
    tools: Tools | None = None
    tool_choice: ToolChoiceIn | None = None
    conversation: Literal["auto", "none"] = "auto"
    input: Annotated[list[InputItem], Field(max_length=MAX_RESPONSE_INPUT_ITEMS)] | None = None
    metadata: Metadata = None


class ResponseCreate(ClientEvent):
    type: Literal["response.create"]
    response: ResponseParams = Field(default_factory=ResponseParams)


class ResponseCancel(ClientEvent):
    type: Literal["response.cancel"]
    response_id: str | None = None


class OutputAudioClear(ClientEvent):
    """WebRTC: drop the speech not yet played (the response, if any, is cancelled)."""

    type: Literal["output_audio_buffer.clear"]


class InvalidEvent(TypedMessage):
    """A client event that did not parse: answered in turn with an `error`."""

    type: Any = None
    event_id: str | None = None
    message: str
    param: str | None = None


ClientMessage = (
    SessionUpdate
    | AudioAppend
    | AudioCommit
    | AudioClear
    | ItemCreate
    | ItemRetrieve
    | ItemDelete
    | ItemTruncate
    | ResponseCreate
    | ResponseCancel
    | OutputAudioClear
    | UnknownMessage
)
_PARSER = message_parser(ClientMessage)


def decode(raw: str) -> ClientMessage | InvalidEvent | Refusal:
    """One client event, typed; an `InvalidEvent` naming its first problem; or a `Refusal` when it is
    not a JSON object at all."""
    try:
        value = load_json(raw)
    except NestedTooDeep as exc:
        return Refusal(f"Invalid event: {exc}")
    except ValueError:
        return Refusal(INVALID_JSON)
    if not isinstance(value, dict):
        return Refusal(NOT_AN_OBJECT)
    event_id = value.get("event_id")
    event_id = event_id if isinstance(event_id, str) and len(event_id) <= MAX_EVENT_ID_CHARS else None
    try:
        message = _PARSER.validate_python(value)
    except ValidationError as exc:
        first = exc.errors()[0]
        param = field_path(without_tags(first["loc"][1:])) or None  # [0] is the union's tag
        tag = f"{value.get('type')}."
        text = describe_validation_error(exc, lambda field: _untagged(field.removeprefix(tag)))
        return InvalidEvent(type=value.get("type"), event_id=event_id, message=text, param=param)
    if isinstance(message, UnknownMessage):
        return InvalidEvent(type=message.type, event_id=event_id, message=unknown_event(message.type), param="type")
    return message  # type: ignore[no-any-return]


def _untagged(field: str) -> str:
    return ".".join(part for part in field.split(".") if part not in ITEM_TAGS)


# ----------------------------------------------------------------------------- server events


class RealtimeEvent(ServerEvent):
    """A server event: every field goes out (OpenAI sends nulls), with a fresh `event_id`."""

    event_id: str = Field(default_factory=lambda: new_id("event"))

    def to_wire(self) -> dict[str, Any]:
        return {"type": self.type, **self.model_dump(mode="json")}


class TextContent(BaseModel):
    type: Literal["input_text", "output_text"]
    text: str | None


class AudioContent(BaseModel):
    """An audio part as items report it: its transcript, never its audio (the client has its own copy)."""

    type: Literal["input_audio", "output_audio"]
    transcript: str | None


class ImageContent(BaseModel):
    type: Literal["input_image"] = "input_image"
    detail: Literal["auto"] = "auto"


ItemContent = TextContent | AudioContent | ImageContent


class MessageOut(BaseModel):
    """A message item as the server reports it (OpenAI's RealtimeConversationItem)."""

    id: str
    object: Literal["realtime.item"] = "realtime.item"
    type: Literal["message"] = "message"
    role: Role
    status: ItemStatus
    content: list[ItemContent]


class FunctionCallOut(BaseModel):
    id: str
    object: Literal["realtime.item"] = "realtime.item"
    type: Literal["function_call"] = "function_call"
    status: ItemStatus
    call_id: str
    name: str
    arguments: str


class FunctionCallOutputOut(BaseModel):
    id: str
    object: Literal["realtime.item"] = "realtime.item"
    type: Literal["function_call_output"] = "function_call_output"
    status: ItemStatus
    call_id: str
    output: str


ItemOut = MessageOut | FunctionCallOut | FunctionCallOutputOut


class TextPart(BaseModel):
    """The content part a text response streams into."""

    type: Literal["text"] = "text"
    text: str


class AudioPart(BaseModel):
    """The content part a spoken response streams into: its transcript."""

    type: Literal["audio"] = "audio"
    transcript: str


class InputTokenDetails(BaseModel):
    text_tokens: int | None
    audio_tokens: int | None
    image_tokens: int | None
    cached_tokens: int | None


class OutputTokenDetails(BaseModel):
    text_tokens: int | None
    audio_tokens: int | None


class ResponseUsage(BaseModel):
    """OpenAI's RealtimeResponseUsage; what an engine does not count is null."""

    total_tokens: int
    input_tokens: int
    output_tokens: int
    input_token_details: InputTokenDetails
    output_token_details: OutputTokenDetails


class DurationUsage(BaseModel):
    """What the recogniser heard, as OpenAI reports a transcription's usage."""

    type: Literal["duration"] = "duration"
    seconds: float


class FailureError(BaseModel):
    type: str
    message: str | None


class CancelledDetails(BaseModel):
    type: Literal["cancelled"] = "cancelled"
    reason: Literal["client_cancelled", "turn_detected"]


class FailedDetails(BaseModel):
    type: Literal["failed"] = "failed"
    error: FailureError


class ResponseOut(BaseModel):
    """A response as the server reports it (OpenAI's RealtimeResponse)."""

    id: str
    object: Literal["realtime.response"] = "realtime.response"
    status: Literal["in_progress", "completed", "cancelled", "failed"]
    status_details: CancelledDetails | FailedDetails | None = None
    output: list[ItemOut]
    output_modalities: list[Literal["text", "audio"]]
    conversation_id: str | None = None  # None: out-of-band
    metadata: dict[str, str] | None = None
    usage: ResponseUsage | None = None


class ErrorDetail(BaseModel):
    type: str
    code: str | None = None
    message: str
    param: str | None = None
    event_id: str | None = None


class ErrorEvent(RealtimeEvent):
    type: ClassVar[str] = "error"
    error: ErrorDetail

    @property
    def error_message(self) -> str:
        return self.error.message


class SessionCreated(RealtimeEvent):
    type: ClassVar[str] = "session.created"
    session: dict[str, Any]


class SessionUpdated(RealtimeEvent):
    type: ClassVar[str] = "session.updated"
    session: dict[str, Any]


class AudioCommitted(RealtimeEvent):
    type: ClassVar[str] = "input_audio_buffer.committed"
    item_id: str
    previous_item_id: str | None


class SpeechStarted(RealtimeEvent):
    type: ClassVar[str] = "input_audio_buffer.speech_started"
    audio_start_ms: int
    item_id: str


class SpeechStopped(RealtimeEvent):
    type: ClassVar[str] = "input_audio_buffer.speech_stopped"
    audio_end_ms: int
    item_id: str


class TimeoutTriggered(RealtimeEvent):
    type: ClassVar[str] = "input_audio_buffer.timeout_triggered"
    audio_start_ms: int
    audio_end_ms: int
    item_id: str


class AudioCleared(RealtimeEvent):
    type: ClassVar[str] = "input_audio_buffer.cleared"


class ItemAdded(RealtimeEvent):
    type: ClassVar[str] = "conversation.item.added"
    item: ItemOut
    previous_item_id: str | None


class ItemDone(RealtimeEvent):
    type: ClassVar[str] = "conversation.item.done"
    item: ItemOut
    previous_item_id: str | None


class TranscriptionDelta(RealtimeEvent):
    type: ClassVar[str] = "conversation.item.input_audio_transcription.delta"
    item_id: str
    content_index: int = 0
    delta: str


class TranscriptionCompleted(RealtimeEvent):
    type: ClassVar[str] = "conversation.item.input_audio_transcription.completed"
    item_id: str
    content_index: int = 0
    transcript: str
    usage: DurationUsage


class TranscriptionFailed(RealtimeEvent):
    type: ClassVar[str] = "conversation.item.input_audio_transcription.failed"
    item_id: str
    content_index: int = 0
    error: ErrorDetail


class ItemRetrieved(RealtimeEvent):
    type: ClassVar[str] = "conversation.item.retrieved"
    item: ItemOut


class ItemDeleted(RealtimeEvent):
    type: ClassVar[str] = "conversation.item.deleted"
    item_id: str


class ItemTruncated(RealtimeEvent):
    type: ClassVar[str] = "conversation.item.truncated"
    item_id: str
    content_index: int
    audio_end_ms: int


class ResponseCreated(RealtimeEvent):
    type: ClassVar[str] = "response.created"
    response: ResponseOut


class ResponseDone(RealtimeEvent):
    type: ClassVar[str] = "response.done"
    response: ResponseOut


class OutputItemAdded(RealtimeEvent):
    type: ClassVar[str] = "response.output_item.added"
    response_id: str
    output_index: int
    item: ItemOut


class OutputItemDone(RealtimeEvent):
    type: ClassVar[str] = "response.output_item.done"
    response_id: str
    output_index: int
    item: ItemOut


class OutputAudioStarted(RealtimeEvent):
    """WebRTC: the response's speech started on the audio track."""

    type: ClassVar[str] = "output_audio_buffer.started"
    response_id: str


class OutputAudioStopped(RealtimeEvent):
    """WebRTC: the response's speech has played out."""

    type: ClassVar[str] = "output_audio_buffer.stopped"
    response_id: str


class OutputAudioCleared(RealtimeEvent):
    """WebRTC: the response's unplayed speech was dropped (a cancel or a barge-in)."""

    type: ClassVar[str] = "output_audio_buffer.cleared"
    response_id: str


class PartEvent(RealtimeEvent):
    """Fields every event about one content part of the response's output item carries."""

    response_id: str
    item_id: str
    output_index: int = 0
    content_index: int = 0


class ContentPartAdded(PartEvent):
    type: ClassVar[str] = "response.content_part.added"
    part: TextPart | AudioPart


class ContentPartDone(PartEvent):
    type: ClassVar[str] = "response.content_part.done"
    part: TextPart | AudioPart


class TextDelta(PartEvent):
    type: ClassVar[str] = "response.output_text.delta"
    delta: str


class TextDone(PartEvent):
    type: ClassVar[str] = "response.output_text.done"
    text: str


class AudioDelta(PartEvent):
    type: ClassVar[str] = "response.output_audio.delta"
    delta: str  # base64 PCM16 24 kHz mono


class AudioDone(PartEvent):
    type: ClassVar[str] = "response.output_audio.done"


class TranscriptDelta(PartEvent):
    type: ClassVar[str] = "response.output_audio_transcript.delta"
    delta: str


class TranscriptDone(PartEvent):
    type: ClassVar[str] = "response.output_audio_transcript.done"
    transcript: str


class CallEvent(RealtimeEvent):
    """Fields every event about one function_call item of a response carries."""

    response_id: str
    item_id: str
    output_index: int
    call_id: str


class ArgumentsDelta(CallEvent):
    type: ClassVar[str] = "response.function_call_arguments.delta"
    delta: str


class ArgumentsDone(CallEvent):
    """Sent when a call's arguments are complete, and when its response ends before they are."""

    type: ClassVar[str] = "response.function_call_arguments.done"
    name: str
    arguments: str
