"""Lossy networks: generated video arrives complete (lost packets resent on NACK) or recovers
within a second after an outage, understanding turns still answer and the talker is still heard.

Loss is made by nftables in a namespace of each test's own (tests/lossy.py; this kernel has no
netem, so there is no delay or jitter here). The figures come from tests/lossy_probe.py, which
docs/benchmarks.md runs by hand.
"""

from __future__ import annotations

import pytest

from .lossy import require_nftables
from .lossy_probe import FRAMES, measure

pytestmark = pytest.mark.slow


def test_two_percent_random_loss_loses_no_frame_and_keeps_the_talker_heard() -> None:
    require_nftables()
    figures = measure(loss_percent=2)
    for watcher in ("creator", "whep_viewer"):
        video = figures["generation"][watcher]
        assert video["missing"] == [] and video["in_order"], (watcher, video)
    turn = figures["understanding"]
    assert turn["answered"], turn
    assert turn["talker_heard_s"] >= 0.9 * turn["talker_spoken_s"] > 0, turn


def test_video_recovers_within_a_second_of_an_outage_and_the_turn_still_answers() -> None:
    require_nftables()
    outage_s = 0.5
    figures = measure(outage_s=outage_s)
    for watcher in ("creator", "whep_viewer"):
        video = figures["generation"][watcher]
        assert video["in_order"] and video["received"] >= FRAMES - 2 * outage_s * 24, (watcher, video)
        assert all(seconds <= 1.0 for seconds in video["recovered_after_s"]), (watcher, video)
    turn = figures["understanding"]
    assert turn["answered"], turn
    assert turn["talker_heard_s"] >= turn["talker_spoken_s"] - outage_s - 0.5 > 0, turn
