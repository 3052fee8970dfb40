"""Lossy networks: generated video arrives whole and in order (lost packets are resent on NACK)
and recovers within a second after an outage, understanding turns still answer, the talker is
still heard, and a WHIP publisher goes on publishing.

Loss is made by nftables in a namespace of each test's own; this kernel has no netem, so delay and
jitter are added to every datagram inside the probe's process (tests/lossy.py). The figures come
from tests/lossy_probe.py, which docs/benchmarks.md runs by hand.

The peers are aiortc's, whose video jitter buffer cannot take back what precedes the first packet
it received (a lost first packet of the first keyframe costs the frames up to the keyframe its
PLI brings) and releases at most one frame per packet that arrives: once a resent packet fills a
hole, the frames complete behind it come out one per later packet, so with one packet per frame
(small generated frames) the receiver stays a frame behind per recovered loss and the last few
frames of a stream never leave its buffer. It also asks for a lost packet only once: when the
NACK or the resent packet is lost too, it waits for that packet for good and the stream stops
there. A browser does none of this; the assertions allow for it at the head (RECEIVER_HEAD frames,
0.5 s) and as a stop before the end, never as a frame skipped mid-stream.
"""

from __future__ import annotations

import re
from typing import Any

import pytest

from .lossy import require_nftables
from .lossy_probe import FRAMES, measure

pytestmark = pytest.mark.slow

RECEIVER_HEAD = 12  # a PLI's keyframe within 0.5 s at 24 fps
# ~5.5 s of talker, across which the outage falls (the whole answer: ~10 s). The random-loss test
# speaks the whole answer: at 2 % loss a listener hears 80-89 % of the talker (docs/benchmarks.md),
# and over 5.5 s one unlucky run fell to 74 %, under the 75 % the test asks.
SPOKEN_SENTENCES = 3


def names_red_and_the_tone(answer: str) -> bool:
    """The answer names the camera's red and the microphone's 440 Hz (lost packets shift the estimate
    a few hertz, as they shorten what was heard)."""
    hz = re.search(r"dominant frequency about (\d+) Hz", answer)
    return "mostly red" in answer and hz is not None and 430 <= int(hz.group(1)) <= 450


def assert_whole_and_in_order(video: dict[str, Any]) -> None:
    """In order, and nothing skipped: frames missing after the head are a run up to the end."""
    assert video["in_order"], video
    later = [i for i in video["missing"] if i >= RECEIVER_HEAD]
    assert later == list(range(FRAMES - len(later), FRAMES)), video


def assert_whip_publishing_continued(whip: dict[str, Any]) -> None:
    """The controller's question about the publisher is answered, and the camera (30 fps) still arrives."""
    assert names_red_and_the_tone(whip["answer"]) and not whip["errors"], whip
    assert whip["publisher_state"] == "connected" and whip["frames_received_per_s"] >= 10, whip


def test_two_percent_loss_and_30_ms_of_jittered_delay_lose_no_frame_and_keep_the_talker_heard() -> None:
    require_nftables()
    figures = measure(loss_percent=2, delay_ms=30, jitter_ms=10)
    for watcher in ("creator", "whep_viewer"):
        assert_whole_and_in_order(figures["generation"][watcher])
    turn = figures["understanding"]
    assert names_red_and_the_tone(turn["answer"]) and not turn["errors"], turn
    assert turn["talker_heard_s"] >= 0.75 * turn["talker_spoken_s"] > 0, turn
    assert_whip_publishing_continued(figures["whip"])


def test_video_recovers_within_a_second_of_an_outage_and_the_turn_still_answers() -> None:
    require_nftables()
    outage_s = 0.5
    figures = measure(outage_s=outage_s, spoken_sentences=SPOKEN_SENTENCES)
    for watcher in ("creator", "whep_viewer"):
        video = figures["generation"][watcher]
        assert_whole_and_in_order(video)
        assert len(video["recovered_after_s"]) == 2 and max(video["recovered_after_s"]) <= 1.0, video
    turn = figures["understanding"]
    assert names_red_and_the_tone(turn["answer"]) and not turn["errors"], turn
    assert turn["talker_heard_s"] >= 0.75 * (turn["talker_spoken_s"] - outage_s) > 0, turn
    assert_whip_publishing_continued(figures["whip"])
