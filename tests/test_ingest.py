"""media/ingest.py: camera frames sampled at the session's rate in media time; the mic at 16 kHz mono."""

from __future__ import annotations

import asyncio

from aiortc import RTCPeerConnection
from aiortc.mediastreams import MediaStreamTrack

from rtc_omni.client.media import ToneAudioTrack
from rtc_omni.engines.synthetic import dominant_frequency
from rtc_omni.media.ingest import FrameSampler
from rtc_omni.patches.decoding import decode_audio_on_the_loop
from rtc_omni.signaling.ice import rtc_configuration


def test_frame_sampler_keeps_the_rate_in_media_time() -> None:
    sampler = FrameSampler()
    taken = [i for i in range(90) if sampler.take(i / 30, 2.0)]
    assert taken == [0, 15, 30, 45, 60, 75]
    assert sampler.take(100.0, 2.0)  # a jump forward resyncs instead of bursting


async def test_a_microphone_arrives_as_16_khz_mono_pcm16() -> None:
    """patches/decoding.py: the mic is decoded on the loop straight to what sessions consume."""
    offerer, answerer = RTCPeerConnection(rtc_configuration([])), RTCPeerConnection(rtc_configuration([]))
    received: list[MediaStreamTrack] = []
    answerer.on("track", received.append)
    try:
        offerer.addTransceiver(ToneAudioTrack(440.0), direction="sendonly")
        await offerer.setLocalDescription(await offerer.createOffer())
        await answerer.setRemoteDescription(offerer.localDescription)
        decode_audio_on_the_loop(answerer)
        await answerer.setLocalDescription(await answerer.createAnswer())
        await offerer.setRemoteDescription(answerer.localDescription)
        async with asyncio.timeout(10):
            while not received:
                await asyncio.sleep(0.05)
            frames = [await received[0].recv() for _ in range(50)]
    finally:
        await offerer.close()
        await answerer.close()
    assert {(f.sample_rate, f.layout.name, f.format.name) for f in frames} == {(16_000, "mono", "s16")}
    pcm = b"".join(f.to_ndarray().tobytes() for f in frames[10:])
    assert abs((dominant_frequency(pcm, 16_000) or 0) - 440) < 10
