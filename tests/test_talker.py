"""media/talker.py: the outgoing speech track's encoding, pacing, pauses, flush and bounded buffer."""

from __future__ import annotations

import asyncio
import time

import av
import numpy as np
import pytest
from aiortc.mediastreams import MediaStreamError

from rtc_omni.media.talker import FLUSH_BURST_PACKETS, FLUSH_PACKET_MS, TAIL_PACKETS, TalkerAudioTrack
from rtc_omni.pcm import float_to_pcm16

RTP_CLOCK = 48_000


def decode(packets: list[av.Packet]) -> np.ndarray:
    """What a peer hears: the packets through a fresh Opus decoder, 48 kHz mono float."""
    decoder = av.CodecContext.create("libopus", "r")
    decoder.format, decoder.layout, decoder.sample_rate = "s16", "mono", RTP_CLOCK  # type: ignore[attr-defined]
    frames = [f for p in packets for f in decoder.decode(av.Packet(bytes(p)))]
    return np.concatenate([f.to_ndarray().reshape(-1) for f in frames]).astype(np.float32) / 32768


def tone(seconds: float, amplitude: float = 0.5) -> np.ndarray:
    t = np.arange(int(seconds * 24_000)) / 24_000
    return (amplitude * np.sin(2 * np.pi * 300 * t)).astype(np.float32)


def sixty_ms_talker() -> TalkerAudioTrack:
    """A talker in 60 ms packets, whose timings the tests below spell out."""
    talker = TalkerAudioTrack()
    talker.packet_ms = 60
    return talker


@pytest.mark.parametrize("packet_ms", [120, 60])
async def test_talker_sends_paced_opus_packets_of_the_engines_audio(packet_ms: int) -> None:
    talker = TalkerAudioTrack()
    assert talker.packet_ms == 120  # --talker-packet-ms's default
    talker.packet_ms = packet_ms
    await talker.write(float_to_pcm16(tone(1.0)))
    started = time.monotonic()
    packets = [await talker.recv() for _ in range(5)]
    assert (
        time.monotonic() - started >= 4 * packet_ms / 1000 - 0.01
    )  # five packets take four packet times after the first
    assert all(isinstance(p, av.Packet) for p in packets)
    step = packet_ms * RTP_CLOCK // 1000
    assert [p.pts for p in packets] == [i * step for i in range(5)]  # in the 48 kHz RTP clock
    heard = decode(packets)  # a 120 ms packet is two 60 ms Opus frames, which every Opus decoder takes
    assert heard.size == 5 * step
    assert np.sqrt(np.mean(heard[step:] ** 2)) > 0.2  # the tone, not silence
    assert max(len(bytes(p)) for p in packets) < packet_ms * 32 // 8 * 2  # ~32 kb/s, not 96
    talker.stop()


async def test_an_idle_talker_encodes_and_sends_nothing() -> None:
    talker = TalkerAudioTrack()
    with pytest.raises(TimeoutError):
        async with asyncio.timeout(0.3):
            await talker.recv()
    assert talker.packets_sent == 0 and talker.voiced_ms_sent == 0
    talker.stop()


async def test_after_a_pause_timestamps_follow_the_wall_clock() -> None:
    talker = sixty_ms_talker()
    await talker.write(float_to_pcm16(tone(0.1)))
    first = [await talker.recv() for _ in range(2 + TAIL_PACKETS)]  # two voiced packets, then the silent tail
    assert np.abs(decode(first)[-1000:]).max() < 0.01
    with pytest.raises(TimeoutError):
        async with asyncio.timeout(0.5):
            await talker.recv()
    await talker.write(float_to_pcm16(tone(0.1)))
    resumed = await talker.recv()
    gap_s = (resumed.pts - first[-1].pts) / RTP_CLOCK
    assert 0.5 < gap_s < 0.8  # the pause is in the timestamps, so the peer's jitter buffer keeps its delay
    talker.stop()


async def test_flush_silences_the_talker_within_one_packet() -> None:
    talker = sixty_ms_talker()
    await talker.write(float_to_pcm16(tone(2.0)))
    spoken = [await talker.recv() for _ in range(3)]
    assert talker.flush() > 1500
    assert await talker.wait_drained(0.1)
    # silent packets end the speech (a burst of short ones, then the tail); then nothing
    tail = [await talker.recv() for _ in range(FLUSH_BURST_PACKETS + TAIL_PACKETS)]
    heard = decode(spoken + tail)
    assert np.abs(heard[-2000:]).max() < 0.01
    with pytest.raises(TimeoutError):
        async with asyncio.timeout(0.3):
            await talker.recv()
    assert talker.packets_sent == 3 + FLUSH_BURST_PACKETS + TAIL_PACKETS and talker.voiced_ms_sent == 180


async def test_a_flush_during_speech_sends_what_a_plain_peer_holds_at_once_and_the_clock_stays_near() -> None:
    """aiortc's receiver holds four packets: five short silent ones at once release the speech it
    held, and the next answer is not kept waiting for the clock they ran ahead."""
    talker = sixty_ms_talker()
    await talker.write(float_to_pcm16(tone(2.0)))
    spoken = [await talker.recv() for _ in range(2)]
    flushed = time.monotonic()
    talker.flush()
    burst = [await talker.recv() for _ in range(FLUSH_BURST_PACKETS)]
    assert time.monotonic() - flushed < 0.06  # at once: all before the next 60 ms slot
    step = FLUSH_PACKET_MS * RTP_CLOCK // 1000
    assert [p.pts - burst[0].pts for p in burst] == [i * step for i in range(FLUSH_BURST_PACKETS)]
    assert burst[0].pts == spoken[-1].pts + 60 * RTP_CLOCK // 1000
    assert np.abs(decode(burst)).max() < 0.01
    await talker.write(float_to_pcm16(tone(0.5)))  # the next answer, at once
    answered = time.monotonic()
    packet = await talker.recv()
    assert (
        time.monotonic() - answered < 0.06 + FLUSH_BURST_PACKETS * FLUSH_PACKET_MS / 1000 + 0.03
    )  # its slot, later by the burst
    assert packet.pts == burst[-1].pts + step
    talker.stop()
    talker.stop()


async def test_flush_sends_the_first_silent_packet_ahead_of_its_slot() -> None:
    talker = sixty_ms_talker()
    await talker.write(float_to_pcm16(tone(2.0)))
    await talker.recv()
    loop = asyncio.get_running_loop()
    slot = loop.time() + 0.06  # the next 60 ms packet's time
    waiting = asyncio.ensure_future(talker.recv())
    await asyncio.sleep(0)  # recv() now waits for the slot
    talker.flush()
    packet = await waiting
    assert loop.time() < slot - 0.02, "the silent packet waited for its slot"
    assert np.abs(decode([packet])[-1000:]).max() < 0.01
    talker.stop()


async def test_interrupts_in_quick_succession_never_run_the_clock_far_ahead() -> None:
    talker = sixty_ms_talker()
    await talker.write(float_to_pcm16(tone(1.0)))
    started = time.monotonic()
    first = await talker.recv()
    for _ in range(8):  # each flush may burst short silent packets at once, ahead of their slots
        talker.flush()
        packet = await talker.recv()
    ahead_s = (packet.pts - first.pts) / RTP_CLOCK - (time.monotonic() - started)
    assert ahead_s <= 0.06 + 2 * FLUSH_BURST_PACKETS * FLUSH_PACKET_MS / 1000 + 0.01  # a slot and two bursts
    talker.stop()


async def test_an_interrupt_is_followed_by_silence_even_when_the_talker_was_quiet() -> None:
    talker = TalkerAudioTrack()
    talker.flush()  # a cancel before the answer's first audio
    silence = [await talker.recv() for _ in range(TAIL_PACKETS)]
    assert np.abs(decode(silence)).max() < 0.01
    with pytest.raises(TimeoutError):
        async with asyncio.timeout(0.3):
            await talker.recv()
    talker.stop()


async def test_the_echo_reference_holds_only_voiced_audio_at_16_khz() -> None:
    talker = sixty_ms_talker()
    await talker.write(float_to_pcm16(tone(0.12)))
    for _ in range(2 + TAIL_PACKETS):
        await talker.recv()  # two voiced packets and the silent tail
    kept = list(talker.echo._packets)
    assert len(kept) == 2 and all(x.size == 960 for _, _, x in kept)  # 60 ms at 16 kHz each
    assert talker.echo.audible_since(time.monotonic() - 1)
    talker.stop()


async def test_a_peer_that_allows_less_gets_shorter_packets() -> None:
    talker = TalkerAudioTrack()
    talker.packet_ms = 20
    await talker.write(float_to_pcm16(tone(0.1)))
    packets = [await talker.recv() for _ in range(2)]
    assert packets[1].pts - packets[0].pts == 960
    talker.stop()


async def test_talker_write_waits_while_the_buffer_is_full() -> None:
    talker = TalkerAudioTrack(max_buffer_s=0.1, write_timeout_s=0.2)
    await talker.write(bytes(2 * 4800))  # 200 ms > the 100 ms bound
    with pytest.raises(TimeoutError):
        await talker.write(bytes(2 * 480))
    talker.stop()


async def test_stop_ends_a_waiting_recv() -> None:
    talker = TalkerAudioTrack()
    waiting = asyncio.ensure_future(talker.recv())
    await asyncio.sleep(0.05)
    talker.stop()
    with pytest.raises(MediaStreamError):
        async with asyncio.timeout(1):
            await waiting


async def test_hold_stops_the_speech_at_once_and_release_goes_on_from_the_first_unsent_sample() -> None:
    talker = sixty_ms_talker()
    await talker.write(float_to_pcm16(tone(0.6)))  # ten 60 ms packets
    spoken = [await talker.recv() for _ in range(3)]
    talker.hold()
    burst = [await talker.recv() for _ in range(FLUSH_BURST_PACKETS)]
    with pytest.raises(TimeoutError):  # held: after the burst nothing, not even the tail
        async with asyncio.timeout(0.2):
            await talker.recv()
    assert not await talker.wait_drained(0.01) and talker.buffered_ms == pytest.approx(420)
    released = time.monotonic()
    talker.release()
    rest = [await talker.recv()]
    assert time.monotonic() - released < 0.06  # before its slot: the silence lasts no longer than the hold
    rest += [await talker.recv() for _ in range(6)]
    assert np.abs(decode(burst)).max() < 0.01
    assert talker.voiced_ms_sent == 600  # nothing of the speech was lost
    assert await talker.wait_drained(0.5)
    assert len(spoken + rest) == 10
    talker.stop()


async def test_park_puts_back_what_was_sent_after_the_rewind_point_and_release_does_not_unpark() -> None:
    talker = sixty_ms_talker()
    await talker.write(float_to_pcm16(tone(0.6)))  # ten 60 ms packets
    heard = [await talker.recv() for _ in range(4)]
    rewind_to = time.monotonic()  # the peer was last heard from here: what follows may be lost
    lost = [await talker.recv() for _ in range(2)]
    talker.park(rewind_to)
    assert talker.buffered_ms == pytest.approx(360)  # the two lost packets are queued again, first
    talker.hold()
    talker.release()  # a barge-in's end never ends a park
    with pytest.raises(TimeoutError):  # the tail of silence, then nothing while parked
        async with asyncio.timeout(0.6):
            while True:
                assert np.abs(decode([await talker.recv()])).max() < 0.01
    talker.unpark()
    rest = [await talker.recv() for _ in range(6)]
    assert await talker.wait_drained(0.5)
    assert talker.voiced_ms_sent == 60 * len(heard + lost + rest)  # the 120 ms lost were sent twice
    assert len(heard + rest) == 10  # and together with what was heard, they are the whole answer
    talker.stop()


async def test_a_flushed_answer_is_never_rewound() -> None:
    talker = sixty_ms_talker()
    await talker.write(float_to_pcm16(tone(0.3)))
    rewind_to = time.monotonic()
    _ = [await talker.recv() for _ in range(2)]
    talker.flush()
    talker.park(rewind_to)
    assert talker.buffered_ms == 0
    talker.stop()
