"""Validation errors as users read them: one plain sentence per invalid field.

pydantic's own text ("1 validation error for VideoGenerationRequest ... [type=value_error, ...]
For further information visit https://errors.pydantic.dev/...") is written for the programmer of
the model. Every place that turns a `ValidationError` into an `error` event, an HTTP body or a CLI
message uses `describe_validation_error` instead, so the page, the CLI and the protocol say the
same thing the same way.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from pydantic import ValidationError
from pydantic_core import ErrorDetails

MAX_INPUT_REPR = 40  # a huge bad value is named, not echoed back whole

OBJECT_EXPECTED = ("model_type", "model_attributes_type", "dict_type")

FieldLabel = Callable[[str], str]


def _field(loc: Sequence[int | str]) -> str:
    return ".".join(str(part) for part in loc)


def _shown_input(error: ErrorDetails) -> str:
    """` (got 'abc')` for a short scalar input; nothing for a missing field or a whole object."""
    value = error.get("input")
    if error["type"] == "missing" or not isinstance(value, str | int | float | bool):
        return ""
    shown = repr(value)
    if len(shown) > MAX_INPUT_REPR:
        shown = shown[: MAX_INPUT_REPR - 3] + "..."
    return f" (got {shown})"


def _sentence(error: ErrorDetails, label: FieldLabel) -> str:
    field = _field(error["loc"])
    subject = label(field) if field else ""
    message = error["msg"]
    for prefix in ("Value error, ", "Assertion failed, "):  # a validator's own ValueError text
        if message.startswith(prefix):
            message = message[len(prefix) :]
    if error["type"].endswith("_parsing"):  # "..., unable to parse string as an integer" adds nothing
        message = message.split(", ")[0]
    if error["type"] == "missing":
        text = f"{subject or 'a field'} is required"
    elif error["type"] in OBJECT_EXPECTED:
        text = f"{subject} should be a JSON object" if subject else "expected a JSON object"
    elif error["type"] == "extra_forbidden":
        text = f"{subject} is not a known field"
    elif message.startswith("Input should be") and subject:
        text = f"{subject} should be{message[len('Input should be') :]}{_shown_input(error)}"
    elif subject and not message.startswith(subject):  # a validator's message may name its field
        text = f"{subject}: {message}{_shown_input(error)}"
    else:
        text = f"{message}{_shown_input(error)}"
    return text if text.endswith((".", "?", "!")) else text + "."


def describe_validation_error(exc: ValidationError, label: FieldLabel = str) -> str:
    """One sentence per invalid field, e.g. "size must be 'WIDTHxHEIGHT', e.g. '832x480' (got '100').".

    `label` names a field for the reader (the settings name `port` as `--port (RTC_OMNI_PORT)`).
    """
    return " ".join(_sentence(error, label) for error in exc.errors(include_url=False))


def error_text(exc: BaseException) -> str:
    """Any exception as text for a user: validation errors as sentences, others by their message,
    or their type when they have none (a bare TimeoutError)."""
    if isinstance(exc, ValidationError):
        return describe_validation_error(exc)
    return str(exc) or type(exc).__name__
