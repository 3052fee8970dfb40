"""media/evs.py: the EVS similarity filter, on vLLM-Omni's reference thresholds."""

from __future__ import annotations

import pytest
from PIL import Image

from rtc_omni.media.evs import FrameSimilarityFilter


def grey(level: int, size: int = 64) -> Image.Image:
    return Image.new("RGB", (size, size), (level, level, level))


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
