"""Another Python WebRTC server to compare CPU with: pipecat's SmallWebRTCTransport doing the same
ingest (camera sampled at rtc-omni's rate, mic) plus an audio echo, on 127.0.0.1 only.

Run by `rtc_omni.bench.pipecat_peer` with an interpreter that has `pipecat-ai[webrtc]` (the `[bench]`
extra's pin); it speaks our offer endpoint's shape so the same headless client connects to it.
Usage: python pipecat_server.py PORT SAMPLE_FPS

It runs on uvloop where its interpreter has it, as `rtc-omni serve` does (--event-loop auto), so
both servers run on the same loop; /healthz says which.
"""

from __future__ import annotations

import asyncio
import importlib.util
import sys
import uuid

import aioice.ice
from aiohttp import web
from pipecat.frames.frames import Frame, InputAudioRawFrame, OutputAudioRawFrame
from pipecat.pipeline.pipeline import Pipeline
from pipecat.pipeline.runner import PipelineRunner
from pipecat.pipeline.task import PipelineTask
from pipecat.processors.frame_processor import FrameDirection, FrameProcessor
from pipecat.transports.base_transport import TransportParams
from pipecat.transports.smallwebrtc.connection import SmallWebRTCConnection
from pipecat.transports.smallwebrtc.transport import SmallWebRTCTransport


def _loopback_only(use_ipv4: bool, use_ipv6: bool) -> list[str]:
    return ["127.0.0.1"] if use_ipv4 else []


aioice.ice.get_host_addresses = _loopback_only  # ICE host candidates on 127.0.0.1 only


class Echo(FrameProcessor):
    """Sends every microphone frame back as output audio."""

    async def process_frame(self, frame: Frame, direction: FrameDirection) -> None:
        await super().process_frame(frame, direction)
        if isinstance(frame, InputAudioRawFrame):
            await self.push_frame(OutputAudioRawFrame(frame.audio, frame.sample_rate, frame.num_channels))
        else:
            await self.push_frame(frame, direction)


async def run_pipeline(connection: SmallWebRTCConnection, sample_fps: float) -> None:
    params = TransportParams(audio_in_enabled=True, audio_out_enabled=True, video_in_enabled=True)
    transport = SmallWebRTCTransport(connection, params)

    @transport.event_handler("on_client_connected")
    async def on_connected(transport: SmallWebRTCTransport, client: object) -> None:
        await transport.capture_participant_video(transport.get_client_id(client), framerate=round(sample_fps))

    @transport.event_handler("on_client_disconnected")
    async def on_disconnected(transport: SmallWebRTCTransport, client: object) -> None:
        await task.cancel()

    task = PipelineTask(Pipeline([transport.input(), Echo(), transport.output()]))
    await PipelineRunner(handle_sigint=False).run(task)


async def offer(request: web.Request) -> web.Response:
    body = await request.json()
    connection = SmallWebRTCConnection(ice_servers=[])
    await connection.initialize(sdp=body["sdp"], type=body["type"])
    request.app["tasks"].add(asyncio.ensure_future(run_pipeline(connection, request.app["sample_fps"])))
    answer = connection.get_answer()
    return web.json_response({"session_id": uuid.uuid4().hex, "sdp": answer["sdp"], "type": answer["type"]})


async def healthz(request: web.Request) -> web.Response:
    loop = asyncio.get_running_loop()
    return web.json_response(
        {"ok": True, "event_loop": "uvloop" if type(loop).__module__.startswith("uvloop") else "asyncio"}
    )


def main() -> None:
    app = web.Application()
    app["tasks"] = set()
    app["sample_fps"] = float(sys.argv[2])
    app.router.add_post("/v1/rtc/offer", offer)
    app.router.add_get("/healthz", healthz)
    loop = None
    if importlib.util.find_spec("uvloop") is not None:
        import uvloop

        loop = uvloop.new_event_loop()
    web.run_app(app, host="127.0.0.1", port=int(sys.argv[1]), print=None, loop=loop)


if __name__ == "__main__":
    main()
