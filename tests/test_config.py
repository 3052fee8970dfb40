"""config.py: every setting is a flag and an environment variable."""

from __future__ import annotations

import pytest

from rtc_omni.cli import build_parser
from rtc_omni.config import Settings, load_settings


def test_every_setting_is_a_flag_and_an_environment_variable() -> None:
    args = build_parser().parse_args(
        ["serve", "--port", "9999", "--ice-address", "127.0.0.1", "--ice-address", "::1", "--idle-timeout", "5"]
    )
    settings = load_settings(args, environ={"RTC_OMNI_PORT": "1", "RTC_OMNI_MAX_SESSIONS": "3"})
    assert settings.port == 9999 and settings.max_sessions == 3 and settings.idle_timeout == 5.0
    assert settings.ice_address == ["127.0.0.1", "::1"]
    assert load_settings(None, environ={"RTC_OMNI_ICE_ADDRESS": "all"}).gather_all_interfaces
    for name in Settings.model_fields:
        assert (
            "--" + name.replace("_", "-") in build_parser()._subparsers._group_actions[0].choices["serve"].format_help()
        )
    with pytest.raises(ValueError):
        load_settings(None, environ={"RTC_OMNI_IDLE_TIMEOUT": "-1"})
    assert load_settings(None, environ={"RTC_OMNI_TALKER_PACKET_MS": "60"}).talker_packet_ms == 60
    with pytest.raises(ValueError, match="one of 20, 40, 60, 120"):
        load_settings(None, environ={"RTC_OMNI_TALKER_PACKET_MS": "50"})
