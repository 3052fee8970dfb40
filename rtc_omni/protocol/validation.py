"""Validation errors as users read them: one plain sentence per invalid field.

pydantic's own text ("1 validation error for VideoGenerationRequest ... [type=value_error, ...]
For further information visit https://errors.pydantic.dev/...") is written for the programmer of
the model. Every place that turns a `ValidationError` into an `error` event, an HTTP body or a CLI
message uses `describe_validation_error` instead, so the page, the CLI and the protocol say the
same thing the same way.
"""

from __future__ import annotations

import reprlib
from collections.abc import Callable, Sequence

from pydantic import ValidationError
from pydantic_core import ErrorDetails

MAX_ECHOED_CHARS = 64  # of any client value an error shows: a huge one is named, not echoed back whole
MAX_DESCRIBED_ERRORS = 4  # sentences of one description: a message with thousands of bad fields gets a few

OBJECT_EXPECTED = ("model_type", "model_attributes_type", "dict_type")

FieldLabel = Callable[[str], str]


_REPR = reprlib.Repr()
_REPR.maxstring = _REPR.maxother = MAX_ECHOED_CHARS


def shortened(value: object) -> str:
    """A client's value as an error message may show it: a string as it is, anything else as its repr,
    cut to MAX_ECHOED_CHARS, so that an error costs no more to send than its own words."""
    text = value if isinstance(value, str) else _REPR.repr(value)
    return text if len(text) <= MAX_ECHOED_CHARS else text[: MAX_ECHOED_CHARS - 3] + "..."


def quoted(value: object) -> str:
    """`shortened`, a string in quotes (`'abc'`), as Python shows a value: for an error that names it."""
    return repr(shortened(value)) if isinstance(value, str) else shortened(value)


def field_path(loc: Sequence[int | str]) -> str:
    """A field's dotted path, each name shortened: a client's keys are client input too."""
    return ".".join(shortened(part) for part in loc)


def _shown_input(error: ErrorDetails) -> str:
    """` (got 'abc')` for a scalar input, shortened; nothing for a missing field or a whole object."""
    value = error.get("input")
    if error["type"] == "missing" or not isinstance(value, str | int | float | bool):
        return ""
    return f" (got {quoted(value)})"


def _sentence(error: ErrorDetails, label: FieldLabel) -> str:
    field = field_path(error["loc"])
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
    At most MAX_DESCRIBED_ERRORS sentences, then how many more problems there are.
    """
    errors = exc.errors(include_url=False)
    text = " ".join(_sentence(error, label) for error in errors[:MAX_DESCRIBED_ERRORS])
    more = len(errors) - MAX_DESCRIBED_ERRORS
    return f"{text} ({more} more problems not shown.)" if more > 0 else text


def error_text(exc: BaseException) -> str:
    """Any exception as text for a user: validation errors as sentences, others by their message,
    or their type when they have none (a bare TimeoutError)."""
    if isinstance(exc, ValidationError):
        return describe_validation_error(exc)
    return str(exc) or type(exc).__name__
