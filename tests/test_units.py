"""Unit tests of the pieces that carry vLLM-Omni's exact semantics, and of our own building blocks."""

from __future__ import annotations

import time

import numpy as np
import pytest
from PIL import Image

from rtc_omni.cli import build_parser
from rtc_omni.config import Settings, load_settings
from rtc_omni.engines.synthetic import colour_name, dominant_frequency, espeak_voice, tone_voice
from rtc_omni.media.evs import FrameSimilarityFilter
from rtc_omni.media.ingest import FrameSampler
from rtc_omni.media.talker import TalkerAudioTrack
from rtc_omni.protocol.understand import FrameAck, SessionConfig
from rtc_omni.sessions.frame_buffer import BufferedFrame, FrameBuffer, sample_indices


def grey(level: int, size: int = 64) -> Image.Image:
    return Image.new("RGB", (size, size), (level, level, level))


@pytest.mark.parametrize(
    ("count", "k", "expected"),
    [
        (3, 4, [0, 1, 2]),
        (50, 4, [0, 12, 24, 49]),
        (7, 4, [0, 1, 2, 6]),
        (100, 8, [0, 12, 24, 36, 48, 60, 72, 99]),
        (64, 16, list(range(0, 60, 4)) + [63]),
        (9, 1, [8]),
    ],
)
def test_turn_sampling_matches_the_reference_table(count: int, k: int, expected: list[int]) -> None:
    assert sample_indices(count, k) == expected


def test_frame_buffer_evicts_the_oldest() -> None:
    buffer = FrameBuffer(2)
    frames = [BufferedFrame(data=b"", frame_id=f"f{i}", pts_ms=i) for i in range(3)]
    assert buffer.append(frames[0]) is None and buffer.append(frames[1]) is None
    assert buffer.append(frames[2]) is frames[0]
    assert [f.frame_id for f in buffer.sample(4)] == ["f1", "f2"]


def test_evs_keeps_first_frame_and_compares_with_the_last_kept_one() -> None:
    evs = FrameSimilarityFilter(threshold=0.999)
    assert evs.should_retain(grey(100))
    assert evs.should_retain(grey(110))  # RMS 10 > 8.1: kept (reference table)
    assert not evs.should_retain(grey(115))  # RMS 5 from the last *kept* frame: dropped
    assert evs.should_retain(grey(119))  # drift accumulates: RMS 9 from 110
    assert (evs.stats.retained_count, evs.stats.dropped_count) == (3, 1)


def test_evs_threshold_edges_and_size_independence() -> None:
    never = FrameSimilarityFilter(threshold=0.0)
    assert never.should_retain(grey(0)) and not never.should_retain(grey(255))
    exact = FrameSimilarityFilter(threshold=1.0)
    assert exact.should_retain(grey(10)) and exact.should_retain(grey(11)) and not exact.should_retain(grey(11))
    sizes = FrameSimilarityFilter(threshold=0.95)
    assert sizes.should_retain(grey(50, 32)) and not sizes.should_retain(grey(50, 256))
    with pytest.raises(ValueError):
        FrameSimilarityFilter(threshold=1.5)


def test_session_config_defaults_aliases_and_ranges() -> None:
    config = SessionConfig()
    assert (config.num_frames, config.max_frames, config.frame_filter_threshold) == (4, 50, 0.95)
    assert config.modalities == ["text", "audio"] and config.sample_fps == 2.0 and not config.audio_events
    assert config.track_filter_threshold == SessionConfig.TRACK_DEFAULT_FILTER_THRESHOLD
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


@pytest.mark.parametrize(
    ("rgb", "name"),
    [
        ((250, 3, 2), "red"),
        ((1, 2, 250), "blue"),
        ((0, 250, 5), "green"),
        ((250, 250, 0), "yellow"),
        ((10, 10, 10), "black"),
    ],
)
def test_colour_names(rgb: tuple[int, int, int], name: str) -> None:
    assert colour_name(rgb) == name


def test_dominant_frequency_and_silence() -> None:
    t = np.arange(32000) / 16000
    pcm = (0.2 * 32767 * np.sin(2 * np.pi * 440 * t)).astype("<i2").tobytes()
    assert abs(dominant_frequency(pcm, 16000) - 440) < 2
    assert dominant_frequency(bytes(32000), 16000) is None


def test_tone_voice_speaks_each_word() -> None:
    speech = tone_voice("one two three")
    assert 0.3 < speech.size / 24000 < 1.5 and np.max(np.abs(speech)) > 0.2


def test_frame_sampler_keeps_the_rate_in_media_time() -> None:
    sampler = FrameSampler()
    taken = [i for i in range(90) if sampler.take(i / 30, 2.0)]
    assert taken == [0, 15, 30, 45, 60, 75]
    assert sampler.take(100.0, 2.0)  # a jump forward resyncs instead of bursting


async def test_talker_paces_frames_and_flush_silences_at_once() -> None:
    talker = TalkerAudioTrack()
    await talker.write(0.5 * np.ones(24000, dtype=np.float32))
    started = time.monotonic()
    frames = [await talker.recv() for _ in range(10)]
    assert time.monotonic() - started >= 0.17  # ten 20 ms frames take ~180 ms after the first
    assert all(np.abs(f.to_ndarray()).max() > 10000 for f in frames[1:])
    assert talker.flush() > 700
    assert np.abs((await talker.recv()).to_ndarray()).max() == 0
    assert await talker.wait_drained(0.1)
    talker.stop()


async def test_talker_write_waits_while_the_buffer_is_full() -> None:
    talker = TalkerAudioTrack(max_buffer_s=0.1, write_timeout_s=0.2)
    await talker.write(np.zeros(4800, dtype=np.float32))  # 200 ms > the 100 ms bound
    with pytest.raises(TimeoutError):
        await talker.write(np.zeros(480, dtype=np.float32))
    talker.stop()


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


@pytest.mark.usefixtures("espeak_ng")
def test_espeak_voice_speaks_the_answer() -> None:
    speech = espeak_voice("The newest frame is mostly red.")
    assert 1.0 < speech.size / 24000 < 5.0
    loud = np.abs(speech) > 0.05
    assert loud.mean() > 0.2 and not loud.all()  # speech with pauses, not a tone or silence


def test_marker_jitter_buffer_releases_a_complete_frame_at_once() -> None:
    from aiortc.rtp import RtpPacket

    from rtc_omni.patches.jitter import MarkerJitterBuffer

    def packet(seq: int, ts: int, marker: bool, data: bytes) -> RtpPacket:
        p = RtpPacket(sequence_number=seq, timestamp=ts, marker=marker)
        p._data = data  # type: ignore[attr-defined]
        return p

    buffer = MarkerJitterBuffer()
    assert buffer.add(packet(10, 3000, False, b"a"))[1] is None  # frame not complete yet
    frame = buffer.add(packet(11, 3000, True, b"b"))[1]
    assert frame is not None and frame.data == b"ab" and frame.timestamp == 3000
    # no marker bit: aiortc's rule, released when the next frame begins
    assert buffer.add(packet(12, 6000, False, b"c"))[1] is None
    frame = buffer.add(packet(13, 9000, False, b"d"))[1]
    assert frame is not None and frame.data == b"c"
