"""sessions/frame_buffer.py: which buffered frames a turn takes, and the buffer's bound."""

from __future__ import annotations

import pytest

from rtc_omni.sessions.frame_buffer import BufferedFrame, FrameBuffer, sample_indices


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
