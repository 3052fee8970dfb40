"""protocol/understand_messages.py: session.config's defaults, aliases and ranges; the frame ack's shape."""

from __future__ import annotations

import pytest

from rtc_omni.protocol.understand_messages import FrameAck, SessionConfig


def test_session_config_defaults_aliases_and_ranges() -> None:
    config = SessionConfig()
    assert (config.num_frames, config.max_frames, config.frame_filter_threshold) == (4, 50, 0.95)
    assert config.modalities == ["text", "audio"] and config.sample_fps == 2.0 and not config.audio_events
    assert config.track_filter_threshold is None  # the camera path's default (sessions/camera.py)
    legacy = SessionConfig.model_validate({"num_sample_frames": 8, "evs_enabled": False, "evs_threshold": 0.9})
    assert (legacy.num_frames, legacy.enable_frame_filter, legacy.frame_filter_threshold) == (8, False, 0.9)
    assert legacy.track_filter_threshold == 0.9  # an explicit threshold is honoured exactly
    both = SessionConfig.model_validate({"num_sample_frames": 8, "num_frames": 2})
    assert both.num_frames == 2
    for bad in ({"num_frames": 129}, {"max_frames": 0}, {"frame_filter_threshold": 1.1}, {"sample_fps": 0}):
        with pytest.raises(ValueError):
            SessionConfig.model_validate(bad)


def test_frame_ack_echoes_nulls_but_omits_unset_extras() -> None:
    ack = FrameAck(
        frame_id="a", pts_ms=None, capture_ts_ms=None, accepted=True, buffered_frames=1, server_receive_ts_ms=1.0
    )
    assert ack.to_wire() == {
        "type": "video.frame.ack",
        "frame_id": "a",
        "pts_ms": None,
        "capture_ts_ms": None,
        "accepted": True,
        "buffered_frames": 1,
        "server_receive_ts_ms": 1.0,
    }
