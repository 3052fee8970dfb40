"""What every protocol's codec shares: JSON text in, one typed message or a refusal out; events out.

A protocol module (understand.py, generate.py) parses each client message once, here at the
boundary, into a pydantic model of its own discriminated union, or refuses it with the exact error
string its reference sends. Sessions take only the typed messages, and emit `ServerEvent`s.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar, TypeVar

from pydantic import BaseModel, TypeAdapter

logger = logging.getLogger(__name__)
M = TypeVar("M")

# Our own errors, shared by both vLLM-Omni protocols.
BINARY_NOT_SUPPORTED = "Binary messages are not supported; send JSON text"
MESSAGE_QUEUE_FULL = "Message queue full; message dropped"

UNKNOWN_TAG = "unknown"


@dataclass(frozen=True)
class Refusal:
    """A client message refused before it was queued: the error to send, and whether the reference
    ends its session on it (a bad first message; without `strict_reference` the session goes on)."""

    message: str
    ends_reference_session: bool = False


def decode_object(
    raw: str, *, invalid_json: Refusal, not_an_object: Callable[[Any], Refusal]
) -> dict[str, Any] | Refusal:
    """The JSON object in `raw`, or the protocol's refusal of what is not one."""
    try:
        value = json.loads(raw)
    except (json.JSONDecodeError, RecursionError):
        return invalid_json
    if not isinstance(value, dict):
        return not_an_object(value)
    return value


def validate_message(parser: TypeAdapter[M], value: dict[str, Any]) -> M | Refusal:
    """The typed message; a validator's bug is refused as the loop refuses a handler's, never raised
    into the transport."""
    try:
        return parser.validate_python(value)
    except Exception:
        logger.exception("parsing a %r message failed", value.get("type"))
        return Refusal(f"Internal error handling {value.get('type')!s}")


def message_tag(known: frozenset[str]) -> Callable[[Any], str]:
    """A discriminator for a protocol's union: the message's `type`, or UNKNOWN_TAG for any other
    value (missing, not a string, or a type the protocol does not define)."""

    def tag(value: Any) -> str:
        msg_type = value.get("type") if isinstance(value, dict) else getattr(value, "type", None)
        return msg_type if isinstance(msg_type, str) and msg_type in known else UNKNOWN_TAG

    return tag


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
