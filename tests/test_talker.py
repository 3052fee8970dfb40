"""media/talker.py: the outgoing speech track's pacing, flush and bounded buffer."""

from __future__ import annotations

import time

import numpy as np
import pytest

from rtc_omni.media.talker import TalkerAudioTrack


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
