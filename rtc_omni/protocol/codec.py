"""What every protocol's codec shares: JSON text in, one typed message or a refusal out; events out.

A protocol module (understand_messages.py, generate_messages.py) parses each client message once, here at the
boundary, into a pydantic model of its own discriminated union, or refuses it with the exact error
string its reference sends. Sessions take only the typed messages, and emit `ServerEvent`s. The
remote engine reads another server's events the other way round: `decode_event` types them into the
same `ServerEvent` models.
"""

from __future__ import annotations

import functools
import json
import logging
import operator
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Annotated, Any, ClassVar, TypeVar, get_args

from pydantic import BaseModel, Discriminator, Field, Tag, TypeAdapter, ValidationError

from .validation import describe_validation_error, shortened

logger = logging.getLogger(__name__)
M = TypeVar("M")

# Our own errors, shared by both vLLM-Omni protocols.
BINARY_NOT_SUPPORTED = "Binary messages are not supported; send JSON text"
MESSAGE_QUEUE_FULL = "Message queue full; message dropped"
TEXT_NOT_UTF8 = "A text message that is not valid UTF-8 was dropped; send JSON text in UTF-8"


def event_too_large(size: int) -> str:
    return f"An event of {size} bytes was dropped: larger than one DataChannel message may be"


# `turn_detection.idle_timeout_ms` in both conversational protocols: how long a user may stay silent
# before the assistant prompts them (sessions/idle_prompt.py).
IdleTimeoutMs = Annotated[int, Field(ge=1000, le=600_000)]

UNKNOWN_TAG = "unknown"
# Client JSON may nest this deep. Deeper breaks later than its parse: pydantic serialises at most
# 255 levels ("Circular reference detected"), Python's parser about 1000 (RecursionError).
MAX_JSON_DEPTH = 64
TOO_DEEP = f"JSON nested deeper than {MAX_JSON_DEPTH} levels"


class NestedTooDeep(ValueError):
    """Client JSON nested deeper than MAX_JSON_DEPTH; its message says so."""


def load_json(raw: str | bytes) -> Any:
    """`json.loads` for everything a client sends (HTTP bodies, session messages): ValueError on bad
    JSON, NestedTooDeep past MAX_JSON_DEPTH, so no deep value reaches a model or a reply."""
    try:
        value = json.loads(raw)
    except RecursionError:
        raise NestedTooDeep(TOO_DEEP) from None
    if _deeper_than(value, MAX_JSON_DEPTH):
        raise NestedTooDeep(TOO_DEEP)
    return value


def _deeper_than(value: Any, limit: int) -> bool:
    """Whether more than `limit` objects and arrays nest in `value`, walked level by level (no recursion)."""
    level = [value] if isinstance(value, (dict, list)) else []
    for _ in range(limit):
        if not level:
            return False
        level = [child for c in level for child in _children(c) if isinstance(child, (dict, list))]
    return bool(level)


def _children(container: dict[str, Any] | list[Any]) -> Any:
    return container.values() if isinstance(container, dict) else container


def internal_error(msg_type: Any) -> str:
    """The error for a message whose handling failed (a bug of ours), naming its type."""
    return f"Internal error handling {shortened(msg_type)}"


@dataclass(frozen=True)
class Refusal:
    """A client message refused before it was queued: the error to send, and whether the reference
    ends its session on it (a bad first message; without `strict_reference` the session goes on)."""

    message: str
    ends_reference_session: bool = False

    @classmethod
    def first_or_later(cls, first: bool, first_message: str, later_message: str) -> Refusal:
        """The refusal of what had to be the first message (a config, a start), which ends the
        reference's session, or of a later one, which does not."""
        return cls(first_message, ends_reference_session=True) if first else cls(later_message)


def decode_message(
    raw: str,
    parser: TypeAdapter[M],
    *,
    invalid_json: Refusal,
    not_an_object: Callable[[Any], Refusal],
    screen: Callable[[dict[str, Any]], Refusal | None] = lambda _value: None,
) -> M | Refusal:
    """One client message: JSON, then an object, then `screen`ed, then typed by the protocol's
    `parser`; at the first step it fails, the protocol's refusal."""
    try:
        value = load_json(raw)
    except ValueError:
        return invalid_json
    if not isinstance(value, dict):
        return not_an_object(value)
    refused = screen(value)
    if refused is not None:
        return refused
    try:
        return parser.validate_python(value)
    except Exception:  # a validator's bug is refused as the loop refuses a handler's, never raised
        logger.exception("parsing a %r message failed", value.get("type"))
        return Refusal(internal_error(value.get("type")))


def message_parser(union: Any) -> TypeAdapter[Any]:
    """The parser of a protocol's union of `TypedMessage`s, discriminated by each one's `type`
    Literal; any other `type` (missing, not a string, not defined) parses as `UnknownMessage`."""
    tags = {}
    for model in get_args(union):
        literal = get_args(model.model_fields["type"].annotation)  # () for UnknownMessage's Any
        if literal:
            tags[literal[0]] = model
    members = tuple(Annotated[model, Tag(tag)] for tag, model in tags.items())
    known = frozenset(tags)

    def tag_of(value: Any) -> str:
        msg_type = value.get("type") if isinstance(value, dict) else getattr(value, "type", None)
        return msg_type if isinstance(msg_type, str) and msg_type in known else UNKNOWN_TAG

    tagged = functools.reduce(operator.or_, (*members, Annotated[UnknownMessage, Tag(UNKNOWN_TAG)]))
    return TypeAdapter(Annotated[tagged, Discriminator(tag_of)])


def parsed_or_invalid(
    msg_type: str, field: str, model: type[BaseModel], data: Any, describe: Callable[[str], str]
) -> dict[str, Any]:
    """A message's fields, for a `before` validator: `field` holds `data` validated as `model`, or,
    when it is not valid, `invalid` holds the error to send (the session decides when, in turn)."""
    try:
        return {"type": msg_type, field: model.model_validate(data)}
    except ValidationError as exc:
        return {"type": msg_type, "invalid": describe(describe_validation_error(exc))}


class TypedMessage(BaseModel):
    """Base of every parsed client message; `type` is the raw value for unknown messages."""

    type: Any


class UnknownMessage(TypedMessage):
    """Any message whose `type` the protocol does not define; its error names the raw `type`."""

    type: Any = None


class ServerEvent(BaseModel):
    """Base of every server -> client message."""

    type: ClassVar[str]

    def to_wire(self) -> dict[str, Any]:
        return {"type": self.type, **self.model_dump(mode="json", exclude_unset=True)}

    @property
    def error_message(self) -> str | None:
        """The message of an `error` event (sessions count them), None for every other event."""
        return None


class UnknownEvent(BaseModel):
    """A server event of a type the protocol does not define (a newer or extended server's); its
    reader skips it, as clients skip what they do not know."""

    type: Any = None


class MalformedEvent(BaseModel):
    """A server message that cannot be read: not a JSON object (`type` None), or an event of a known
    type whose fields do not fit its model."""

    type: str | None = None
    problem: str  # e.g. "not JSON", or which fields are wrong


# What one message from another server reads as, whatever it holds.
DecodedEvent = ServerEvent | UnknownEvent | MalformedEvent


def decode_event(raw: str, events: Mapping[str, type[ServerEvent]]) -> DecodedEvent:
    """One message from another server, typed by the model `events` gives its `type`. It never
    raises: what a peer server sends decides only which of the three comes back."""
    try:
        value = load_json(raw)
    except ValueError:
        return MalformedEvent(problem="not JSON")
    if not isinstance(value, dict):
        return MalformedEvent(problem="not a JSON object")
    event_type = value.get("type")
    model = events.get(event_type) if isinstance(event_type, str) else None
    if model is None:
        return UnknownEvent(type=event_type)
    try:
        return model.model_validate(value)
    except ValidationError as exc:
        return MalformedEvent(type=event_type, problem=describe_validation_error(exc))
