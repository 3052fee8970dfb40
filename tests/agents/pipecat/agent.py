"""A pipecat 1.14 voice agent on its OpenAI Realtime service, pointed at a server under test.

Run by tests/test_agents_pipecat.py in the pipecat environment (tests/agents/pipecat/build.sh):

    python agent.py WS_URL SPEECH_PCM

The agent is written as pipecat's docs write one, with only the base URL and key changed, and
server-side turn detection asked for (rtc-omni's sessions start without it; OpenAI's start with
it, so pipecat does not ask). No transport: the script plays the microphone by pushing
InputAudioRawFrames into the pipeline and reads the bot's replies off a processor behind the
service. Three turns, each printed as one JSON line on stdout:

- `tool`: the opening context asks for the weather; the model calls get_weather, pipecat runs
  the handler and sends its result back, and the model's reply reports it;
- `audio`: SPEECH_PCM (24 kHz PCM16 speech) streamed in real time; the server's VAD ends the
  turn and the model replies to what it heard;
- `text`: a typed message appended to the conversation, which the model replies to.
"""

from __future__ import annotations

import asyncio
import json
import sys
from dataclasses import asdict, dataclass, field
from typing import Any

from loguru import logger
from pipecat.adapters.llm.schemas.function_schema import FunctionSchema
from pipecat.adapters.llm.schemas.tools_schema import ToolsSchema
from pipecat.frames.frames import (
    EndFrame,
    ErrorFrame,
    Frame,
    InputAudioRawFrame,
    LLMFullResponseEndFrame,
    LLMMessagesAppendFrame,
    LLMRunFrame,
    LLMTextFrame,
    TTSAudioRawFrame,
)
from pipecat.pipeline.pipeline import Pipeline
from pipecat.pipeline.worker import PipelineParams, PipelineWorker
from pipecat.processors.aggregators.llm_context import LLMContext
from pipecat.processors.aggregators.llm_response_universal import LLMContextAggregatorPair
from pipecat.processors.frame_processor import FrameDirection, FrameProcessor
from pipecat.services.llm_service import FunctionCallHandler, FunctionCallParams
from pipecat.services.openai.realtime.events import AudioConfiguration, AudioInput, SessionProperties, TurnDetection
from pipecat.services.openai.realtime.llm import OpenAIRealtimeLLMService
from pipecat.workers.runner import WorkerRunner

RATE = 24_000  # the Realtime API's PCM16 rate
FRAME_BYTES = RATE * 2 // 50  # 20 ms of microphone audio per frame
REPLY_TIMEOUT_S = 20.0
TOOL_REQUEST = 'What is the weather in Paris? Use get_weather for {"city": "Paris"}'
TYPED_MESSAGE = "Thanks, that is all."


@dataclass
class Reply:
    """One reply of the bot as the app sees it: the words and how much speech came with them."""

    text: str = ""
    speech_bytes: int = 0


@dataclass
class Turn:
    name: str
    reply: Reply
    calls: list[dict[str, Any]] = field(default_factory=list)


class Replies(FrameProcessor):
    """Collects the bot's replies behind the service; a response with no words (one that only
    calls a tool, or an interruption's end) is not a reply."""

    def __init__(self) -> None:
        super().__init__()
        self._current = Reply()
        self._done: asyncio.Queue[Reply | str] = asyncio.Queue()

    async def process_frame(self, frame: Frame, direction: FrameDirection) -> None:
        await super().process_frame(frame, direction)
        if isinstance(frame, LLMTextFrame):
            self._current.text += frame.text
        elif isinstance(frame, TTSAudioRawFrame):
            self._current.speech_bytes += len(frame.audio)
        elif isinstance(frame, LLMFullResponseEndFrame) and self._current.text:
            self._done.put_nowait(self._current)
            self._current = Reply()
        elif isinstance(frame, ErrorFrame):
            self._done.put_nowait(frame.error)
        await self.push_frame(frame, direction)

    async def next(self) -> Reply:
        async with asyncio.timeout(REPLY_TIMEOUT_S):
            reply = await self._done.get()
        if isinstance(reply, str):
            raise RuntimeError(f"the service reported an error: {reply}")
        return reply


def weather_tool(calls: list[dict[str, Any]]) -> tuple[FunctionSchema, FunctionCallHandler]:
    """get_weather(city) -> "22C", and its handler, which notes each call in `calls`."""

    async def get_weather(params: FunctionCallParams) -> None:
        calls.append({"name": params.function_name, "arguments": dict(params.arguments)})
        await params.result_callback("22C")

    schema = FunctionSchema(
        name="get_weather",
        description="The current temperature in a city.",
        properties={"city": {"type": "string"}},
        required=["city"],
    )
    return schema, get_weather


async def speak(worker: PipelineWorker, pcm: bytes) -> None:
    """The microphone: `pcm` in 20 ms frames, at the pace it was spoken."""
    for start in range(0, len(pcm), FRAME_BYTES):
        frame = InputAudioRawFrame(audio=pcm[start : start + FRAME_BYTES], sample_rate=RATE, num_channels=1)
        await worker.queue_frame(frame)
        await asyncio.sleep(0.02)


async def converse(url: str, speech: bytes) -> list[Turn]:
    calls: list[dict[str, Any]] = []
    tool, handler = weather_tool(calls)
    llm = OpenAIRealtimeLLMService(
        api_key="sk-test",
        base_url=url,
        settings=OpenAIRealtimeLLMService.Settings(
            session_properties=SessionProperties(
                audio=AudioConfiguration(input=AudioInput(turn_detection=TurnDetection(type="server_vad")))
            )
        ),
    )
    llm.register_function(tool.name, handler)
    context = LLMContext(messages=[{"role": "user", "content": TOOL_REQUEST}], tools=ToolsSchema([tool]))
    aggregators = LLMContextAggregatorPair(context)
    replies = Replies()
    worker = PipelineWorker(
        Pipeline([aggregators.user(), llm, replies, aggregators.assistant()]),
        params=PipelineParams(audio_in_sample_rate=RATE),
        enable_rtvi=False,
        idle_timeout_secs=None,
    )
    runner = WorkerRunner(handle_sigint=False)
    await runner.add_workers(worker)
    running = asyncio.create_task(runner.run())
    turns: list[Turn] = []
    try:
        await worker.queue_frame(LLMRunFrame())
        turns.append(Turn("tool", await replies.next(), list(calls)))
        await speak(worker, speech)
        turns.append(Turn("audio", await replies.next()))
        # The service takes typed messages itself: the user aggregator only records them.
        typed = LLMMessagesAppendFrame(messages=[{"role": "user", "content": TYPED_MESSAGE}], run_llm=True)
        await llm.queue_frame(typed)
        turns.append(Turn("text", await replies.next()))
    finally:
        await worker.queue_frame(EndFrame())
        async with asyncio.timeout(10):
            await running
    return turns


def main() -> None:
    url, speech_path = sys.argv[1:3]
    logger.remove()
    logger.add(sys.stderr, level="INFO")
    with open(speech_path, "rb") as speech:
        turns = asyncio.run(converse(url, speech.read()))
    for turn in turns:
        print(json.dumps(asdict(turn)), flush=True)


if __name__ == "__main__":
    main()
