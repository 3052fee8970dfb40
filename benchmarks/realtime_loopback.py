"""Benchmark the OpenAI Realtime endpoints over loopback with the official SDK, and print the figures.

  - `response.create` -> first delta (WebSocket): first `response.output_text.delta` of a text
    response and first `response.output_audio.delta` of an audio one; the synthetic engine's
    default time to first token (150 ms) is part of it;
  - `input_audio_buffer.speech_stopped` -> `response.created` (server VAD, WebSocket, espeak-ng
    speech appended as an app streams its microphone);
  - `response.cancel` -> the last voiced frame the peer decodes (a WebRTC call), at a plain aiortc
    peer (its jitter buffer holds 4 packets, as any Python WebRTC client's does) and at one that
    plays packets on arrival (as rtc-omni's own client does).

The server is `rtc-omni serve` (synthetic engine, tone voice) in a subprocess on 127.0.0.1.
Usage: python benchmarks/realtime_loopback.py [--trials 10] [--only cancel]
Run it inside a loopback-only network namespace, like the tests.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import os
import sys
import time
from typing import Any

from aiortc import RTCPeerConnection, RTCSessionDescription
from openai import AsyncOpenAI

from rtc_omni import patches
from rtc_omni.bench.common import start_server, stop, summary
from rtc_omni.client.media import AudioRecorder, ToneAudioTrack, speech48
from rtc_omni.patches.jitter import release_audio_on_arrival
from rtc_omni.signaling.ice import rtc_configuration

TIMEOUT_S = 30.0
QUESTION = {
    "type": "conversation.item.create",
    "item": {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Tell me a story."}]},
}


async def until(connection: Any, event_type: str) -> float:
    """Arrival time of the next `event_type` event."""
    async with asyncio.timeout(TIMEOUT_S):
        while (await connection.recv()).type != event_type:
            pass
    return time.monotonic()


async def first_deltas(url: str, trials: int) -> tuple[list[float], list[float]]:
    text, audio = [], []
    client = AsyncOpenAI(base_url=url + "/v1", api_key="unused")
    async with client.realtime.connect(model="synthetic") as connection:
        for _ in range(trials):
            for modality, samples, delta in (
                ("text", text, "response.output_text.delta"),
                ("audio", audio, "response.output_audio.delta"),
            ):
                await connection.send(QUESTION)
                sent = time.monotonic()
                await connection.send({"type": "response.create", "response": {"output_modalities": [modality]}})
                samples.append(await until(connection, delta) - sent)
                await until(connection, "response.done")
    await client.close()
    return text, audio


async def vad_to_response(url: str, trials: int) -> list[float]:
    pcm = (speech48("What colour is this?")[::2] * 32767).astype("<i2").tobytes() + bytes(48_000)
    latencies = []
    client = AsyncOpenAI(base_url=url + "/v1", api_key="unused")
    async with client.realtime.connect(model="synthetic") as connection:
        await connection.send(
            {"type": "session.update", "session": {"audio": {"input": {"turn_detection": {"type": "server_vad"}}}}}
        )
        for _ in range(trials):
            for start in range(0, len(pcm), 9600):
                chunk = base64.b64encode(pcm[start : start + 9600]).decode("ascii")
                await connection.send({"type": "input_audio_buffer.append", "audio": chunk})
            stopped = await until(connection, "input_audio_buffer.speech_stopped")
            latencies.append(await until(connection, "response.created") - stopped)
            await until(connection, "response.done")
    await client.close()
    return latencies


async def cancel_to_silence(url: str, trials: int, plain: bool) -> list[float]:
    patches.apply()  # the peer gathers on 127.0.0.1 only
    client = AsyncOpenAI(base_url=url + "/v1", api_key="unused")
    latencies = [await one_cancel(client, plain) for _ in range(trials)]
    await client.close()
    return latencies


def last_voiced(recorder: AudioRecorder, since: float) -> float:
    """Arrival of the last voiced frame decoded after `since` (`since` itself when there is none)."""
    voiced = [frame.at for frame in recorder.frames if frame.at >= since and frame.rms >= recorder.SILENCE_RMS]
    return max(voiced, default=since)


async def one_cancel(client: AsyncOpenAI, plain: bool) -> float:
    """One WebRTC call: a spoken answer, cancelled a second into its speech; seconds until the last
    voiced frame the peer decodes."""
    pc = RTCPeerConnection(rtc_configuration([]))
    channel = pc.createDataChannel("oai-events")
    pc.addTrack(ToneAudioTrack(0.0))  # a silent microphone: sendrecv, so the talker comes back
    recorders: list[AudioRecorder] = []
    pc.on("track", lambda track: recorders.append(AudioRecorder(track)))
    events: asyncio.Queue[str] = asyncio.Queue()
    channel.on("message", lambda message: events.put_nowait(json.loads(message)["type"]))
    await pc.setLocalDescription(await pc.createOffer())
    answer = await client.realtime.calls.create(sdp=pc.localDescription.sdp, session={"type": "realtime"})
    await pc.setRemoteDescription(RTCSessionDescription(sdp=answer.text, type="answer"))
    if not plain:
        release_audio_on_arrival(pc)  # as rtc_omni's own client: the talker heard as it is sent
    try:
        async with asyncio.timeout(TIMEOUT_S):
            while channel.readyState != "open":
                await asyncio.sleep(0.01)
            channel.send(json.dumps(QUESTION))
            channel.send(json.dumps({"type": "response.create"}))
            while not recorders or recorders[0].voiced_frames(since=time.monotonic() - 0.1) < 3:
                await asyncio.sleep(0.01)
            await asyncio.sleep(1.0)  # past the first short chunk: the talker now speaks without gaps
            cancelled = time.monotonic()
            channel.send(json.dumps({"type": "response.cancel"}))
            while await events.get() != "response.done":
                pass
        await asyncio.sleep(1.5)  # longer than any held speech plays on
        return last_voiced(recorders[0], cancelled) - cancelled
    finally:
        for recorder in recorders:
            await recorder.stop()
        await pc.close()


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--trials", type=int, default=10)
    parser.add_argument("--only", choices=["cancel"], help="measure only the cancels")
    args = parser.parse_args()
    print(f"machine: {os.cpu_count()} cores, Python {sys.version.split()[0]}")
    process, url = start_server()
    try:
        if args.only is None:
            text, audio = await first_deltas(url, args.trials)
            print(f"response.create -> first output_text.delta:  {summary(text)}  (includes the 150 ms synthetic TTFT)")
            print(f"response.create -> first output_audio.delta: {summary(audio)}")
            vad = await vad_to_response(url, args.trials)
            print(f"speech_stopped -> response.created (server VAD): {summary(vad)}")
        for plain, peer in ((True, "a plain aiortc peer"), (False, "a peer playing on arrival")):
            cancel = await cancel_to_silence(url, args.trials, plain)
            print(f"response.cancel -> last voiced frame decoded at {peer}: {summary(cancel)}")
    finally:
        stop(process)


if __name__ == "__main__":
    asyncio.run(main())
