"""media/ingest.py: camera frames sampled at the session's rate in media time."""

from __future__ import annotations

from rtc_omni.media.ingest import FrameSampler


def test_frame_sampler_keeps_the_rate_in_media_time() -> None:
    sampler = FrameSampler()
    taken = [i for i in range(90) if sampler.take(i / 30, 2.0)]
    assert taken == [0, 15, 30, 45, 60, 75]
    assert sampler.take(100.0, 2.0)  # a jump forward resyncs instead of bursting
