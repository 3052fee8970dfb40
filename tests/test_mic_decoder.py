"""patches/decoding.py's MicDecoder: a microphone's packets become 16 kHz audio on media time, so a
lost packet or a sender's pause is heard as that much silence instead of closing up the stream."""

from __future__ import annotations

import asyncio

import av
import numpy as np
import pytest
from aiortc import RTCRtpCodecParameters
from aiortc.codecs import get_encoder
from aiortc.jitterbuffer import JitterFrame

from rtc_omni.patches.decoding import FILL_AHEAD_S, MAX_FILL_S, MicDecoder

OPUS = RTCRtpCodecParameters(mimeType="audio/opus", clockRate=48_000, channels=2, payloadType=111)
PCMU = RTCRtpCodecParameters(mimeType="audio/PCMU", clockRate=8_000, channels=1, payloadType=0)
PACKET_S = {OPUS.mimeType: 0.06, PCMU.mimeType: 0.02}  # what a browser sends us; aiortc's PCMU is 20 ms


def tone_packets(codec: RTCRtpCodecParameters, count: int) -> list[bytes]:
    """`count` packets of a loud 440 Hz tone as the codec's payloads."""
    samples = int(PACKET_S[codec.mimeType] * 48_000)
    t = np.arange((count + 1) * samples) / 48_000
    pcm = (0.5 * np.sin(2 * np.pi * 440 * t) * 32767).astype(np.int16)
    if codec.mimeType == "audio/opus":
        encoder = av.CodecContext.create("libopus", "w")
        encoder.sample_rate, encoder.layout, encoder.format = 48_000, "mono", "s16"
        encoder.options = {"frame_duration": str(int(PACKET_S[codec.mimeType] * 1000))}
        payloads = []
        for i in range(count):
            frame = av.AudioFrame.from_ndarray(pcm[None, i * samples : (i + 1) * samples], format="s16", layout="mono")
            frame.sample_rate, frame.pts = 48_000, i * samples
            payloads += [bytes(p) for p in encoder.encode(frame)]
        return payloads[:count]
    encoder = get_encoder(codec)
    payloads = []
    for i in range(count + 1):  # its resampler holds some back
        frame = av.AudioFrame.from_ndarray(pcm[None, i * samples : (i + 1) * samples], format="s16", layout="mono")
        frame.sample_rate, frame.pts = 48_000, i * samples
        payloads += encoder.encode(frame)[0]
    return payloads[:count]


def decode(
    codec: RTCRtpCodecParameters, packets: list[tuple[int, bytes]], arrivals: list[float] | None = None
) -> np.ndarray:
    """Feed (timestamp, payload) pairs to a MicDecoder, each arriving at its time in `arrivals`
    (seconds; by default when its timestamp says, as from a live sender); everything it hands on,
    at 16 kHz float."""
    track_queue: asyncio.Queue[av.AudioFrame] = asyncio.Queue()
    now = [0.0]
    decoder = MicDecoder(track_queue, clock=lambda: now[0])
    for index, (timestamp, payload) in enumerate(packets):
        now[0] = (timestamp - packets[0][0]) / codec.clockRate if arrivals is None else arrivals[index]
        decoder.put((codec, JitterFrame(data=payload, timestamp=timestamp % 2**32)))
    resampler = av.AudioResampler(format="s16", layout="mono", rate=16_000)
    out = []
    while not track_queue.empty():
        out += [f.to_ndarray().reshape(-1) for f in resampler.resample(track_queue.get_nowait())]
    return np.concatenate(out).astype(np.float32) / 32768


def rms(x: np.ndarray) -> float:
    return float(np.sqrt(np.mean(x * x)))


@pytest.mark.parametrize("codec", [OPUS, PCMU], ids=["opus", "pcmu"])
def test_a_lost_packet_is_heard_as_silence_where_it_was(codec: RTCRtpCodecParameters) -> None:
    payloads = tone_packets(codec, 20)
    step = int(PACKET_S[codec.mimeType] * codec.clockRate)
    start = 4_294_900_000  # the timestamps wrap on the way
    kept = [(start + i * step, p) for i, p in enumerate(payloads) if i not in (8, 9)]
    audio = decode(codec, kept)
    piece = int(PACKET_S[codec.mimeType] * 16_000)
    assert abs(audio.size - 20 * piece) <= piece // 4  # nothing closed up: 20 packets' time
    # the two lost packets are quiet, the packets around them loud (a quarter packet each side for
    # the codec's and the resampler's delays)
    assert rms(audio[8 * piece + piece // 4 : 10 * piece - piece // 4]) < 0.01
    assert rms(audio[5 * piece : 7 * piece]) > 0.2 and rms(audio[11 * piece : 13 * piece]) > 0.2


def test_a_pause_is_filled_up_to_a_bound_and_a_restarted_stream_is_not() -> None:
    payloads = tone_packets(OPUS, 6)
    step = int(PACKET_S[OPUS.mimeType] * 48_000)
    pause = [(0, payloads[0]), (step, payloads[1]), (step + 10 * 48_000, payloads[2])]  # 10 s of DTX
    assert abs(decode(OPUS, pause).size / 16_000 - (3 * PACKET_S[OPUS.mimeType] + MAX_FILL_S)) < 0.02
    restart = [(0, payloads[0]), (step, payloads[1]), (1_000_000_000, payloads[2])]  # a new random timestamp
    assert abs(decode(OPUS, restart).size / 16_000 - 3 * PACKET_S[OPUS.mimeType]) < 0.02
    behind = [(0, payloads[0]), (step, payloads[1]), (0, payloads[2])]  # timestamps going back: no fill
    assert abs(decode(OPUS, behind).size / 16_000 - 3 * PACKET_S[OPUS.mimeType]) < 0.02


def test_timestamps_that_jump_at_every_packet_get_no_more_silence_than_time_has_passed() -> None:
    payloads = tone_packets(OPUS, 20)
    step = int(PACKET_S[OPUS.mimeType] * 48_000)
    jumping = [(i * 20 * 48_000, p) for i, p in enumerate(payloads)]  # 20 s ahead each time, 60 ms apart
    arrivals = [i * PACKET_S[OPUS.mimeType] for i in range(len(payloads))]
    heard_s = decode(OPUS, jumping, arrivals).size / 16_000
    assert heard_s <= arrivals[-1] + PACKET_S[OPUS.mimeType] + FILL_AHEAD_S + 0.01
    assert heard_s >= len(payloads) * step / 48_000  # every packet's own audio is still there
