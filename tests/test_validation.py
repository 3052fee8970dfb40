"""Validation errors reach users as one plain sentence per field, never as pydantic's own dump."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from rtc_omni.config import SettingsError, load_settings
from rtc_omni.protocol import generate_messages as generate_proto
from rtc_omni.protocol import understand_messages as understand_proto
from rtc_omni.protocol.validation import describe_validation_error, error_text

from .conftest import RunningServer, http_json

VIDEO, CONFIG = generate_proto.VideoGenerationRequest, understand_proto.SessionConfig
PYDANTIC_DUMP = ("validation error for", "errors.pydantic.dev", "[type=", "input_value=", "\n")


def assert_plain(message: str) -> None:
    for fragment in PYDANTIC_DUMP:
        assert fragment not in message, message


def validation_error(model: type, data: object) -> ValidationError:
    with pytest.raises(ValidationError) as caught:
        model.model_validate(data)  # type: ignore[attr-defined]
    return caught.value


@pytest.mark.parametrize(
    ("model", "data", "expected"),
    [
        (VIDEO, {"prompt": "x", "size": "100"}, "size must be 'WIDTHxHEIGHT', e.g. '832x480' (got '100')."),
        (VIDEO, {}, "prompt is required."),
        (CONFIG, {"num_frames": 0}, "num_frames should be greater than or equal to 1 (got 0)."),
        (
            CONFIG,
            {"turn_detection": {"type": "x"}},
            "turn_detection.type should be 'server_vad' or 'semantic_vad' (got 'x').",
        ),
        (generate_proto.Interaction, None, "expected a JSON object."),
        (generate_proto.Interaction, {"event": 3}, "event should be a JSON object."),
    ],
)
def test_each_invalid_field_is_one_plain_sentence(model: type, data: object, expected: str) -> None:
    message = describe_validation_error(validation_error(model, data))
    assert message == expected
    assert_plain(message)


def test_several_fields_give_several_sentences_and_long_values_are_cut() -> None:
    exc = validation_error(understand_proto.SessionConfig, {"num_frames": 0, "sample_fps": "x" * 500})
    message = describe_validation_error(exc)
    assert message.startswith("num_frames should be") and message.count(".") >= 2
    assert "x" * 100 not in message


def test_messages_keep_the_reference_prefix_and_get_plain_details() -> None:
    """What the page and every client see in the `error` event of a bad message."""
    start = generate_proto.decode('{"type": "session.start"}', awaiting_start=True)
    assert isinstance(start, generate_proto.StartMessage)
    assert start.invalid == "Invalid session.start: prompt is required."
    interaction = generate_proto.decode('{"type": "session.interaction", "interaction": {}}', awaiting_start=False)
    assert isinstance(interaction, generate_proto.InteractionMessage)
    assert interaction.invalid == "Invalid session.interaction: event is required."
    config = understand_proto.decode('{"type": "session.config", "num_frames": 0}', awaiting_config=True)
    assert isinstance(config, understand_proto.ConfigMessage)
    assert config.invalid == "Invalid session config: num_frames should be greater than or equal to 1 (got 0)."


def test_settings_errors_name_the_flag_and_the_variable() -> None:
    with pytest.raises(SettingsError) as caught:
        load_settings(None, environ={"RTC_OMNI_PORT": "abc", "RTC_OMNI_UPSTREAM": "http://x"})
    message = str(caught.value)
    assert "--port (RTC_OMNI_PORT) should be a valid integer (got 'abc')." in message
    assert "--upstream (RTC_OMNI_UPSTREAM): 'http://x' is not a ws:// or wss:// URL." in message
    assert_plain(message)


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        ({"type": "offer"}, "invalid offer: sdp is required."),
        ({"sdp": "v=0\r\n", "type": "answer"}, "invalid offer: type should be 'offer' (got 'answer')."),
    ],
)
async def test_a_malformed_offer_gets_a_plain_400(server: RunningServer, body: dict, expected: str) -> None:
    status, reply = await http_json(server, "POST", "/v1/rtc/offer", json=body)
    assert status == 400 and reply["error"] == expected


def test_any_error_has_text_for_the_user() -> None:
    assert error_text(TimeoutError()) == "TimeoutError"  # never an empty message
    assert error_text(ValueError("bad --size")) == "bad --size"
    assert error_text(validation_error(VIDEO, {})) == "prompt is required."
