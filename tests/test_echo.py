"""media/echo.py: the talker's voiced packets as the reference the server VAD's echo check correlates."""

from __future__ import annotations

import numpy as np

from rtc_omni.media.echo import KEEP_S, EchoReference


def voice(seconds: float, seed: int) -> np.ndarray:
    """Speech-like 24 kHz float audio: noise shaped by a syllable envelope."""
    rng = np.random.default_rng(seed)
    t = np.arange(int(seconds * 24_000)) / 24_000
    return (0.3 * rng.standard_normal(t.size) * (0.6 + 0.4 * np.sin(2 * np.pi * 4 * t))).astype(np.float32)


def play(reference: EchoReference, audio24: np.ndarray, at: float, late_s: float = 0.0) -> None:
    """Send `audio24` in 60 ms packets from `at`, every third one `late_s` late (a starved loop)."""
    pcm = (audio24 * 32767).astype(np.int16)
    for i in range(pcm.size // 1440):
        sent = at + i * 0.06 + (late_s if i % 3 == 2 else 0.0)
        reference.played(pcm[i * 1440 : (i + 1) * 1440], position=round(at * 48_000) + i * 2880, at=sent)


def heard(audio24: np.ndarray, delay_s: float, probe_s: float) -> np.ndarray:
    """The last `probe_s` of a mic that hears `audio24` (at 16 kHz) after `delay_s` of silence."""
    mic = np.concatenate([np.zeros(int(delay_s * 16_000), np.float32), audio24[::3].repeat(2)[: audio24.size * 2 // 3]])
    return 0.8 * mic[-int(probe_s * 16_000) :]


def test_echo_of_a_talker_that_just_began_is_recognised() -> None:
    reference = EchoReference()
    spoken = voice(0.18, seed=1)  # three packets: less audio than the 300 ms the mic offers
    play(reference, spoken, at=100.0)
    mic = heard(spoken, delay_s=0.25, probe_s=0.3)
    assert reference.is_echo(mic, mic_end_at=100.0 + 0.25 + 0.18)


def test_a_person_talking_is_not_echo_and_silence_is_not_kept() -> None:
    reference = EchoReference()
    play(reference, voice(1.2, seed=1), at=100.0)
    play(reference, np.zeros(24_000, np.float32), at=101.2)  # silent packets: nothing audible
    assert not reference.is_echo(heard(voice(1.0, seed=2), 0.2, 0.3), mic_end_at=101.4)
    assert reference.audible_since(100.0) and not reference.audible_since(101.2)


def test_echo_is_recognised_when_the_talker_sent_its_packets_late_and_in_bunches() -> None:
    reference = EchoReference()
    spoken = voice(2.0, seed=3)
    play(reference, spoken, at=100.0, late_s=0.05)
    mic = heard(spoken, delay_s=0.3, probe_s=0.3)
    assert reference.is_echo(mic, mic_end_at=100.0 + 0.3 + 2.0)


def test_the_reference_keeps_seconds_not_a_count_of_packets() -> None:
    reference = EchoReference()
    packet = np.zeros(2880, dtype="<i2")  # 120 ms at 24 kHz
    for n in range(200):  # 24 s of 120 ms packets
        reference.played(packet, n * 5760, at=n * 0.12)
    kept = list(reference._packets)
    assert kept[-1][0] - kept[0][0] <= KEEP_S
