"""pipecat-ai 1.14's OpenAI Realtime service, unchanged but for its base URL and key, holds a
conversation with rtc-omni: a tool round trip, a spoken turn and a typed one
(tests/agents/pipecat/agent.py, run in the pipecat environment)."""

from __future__ import annotations

import asyncio
import json
import os
import re
from pathlib import Path

import pytest

from .conftest import RunningServer
from .realtime_client import speech24k
from .tools import agent_env

AGENT = Path(__file__).parent / "agents" / "pipecat" / "agent.py"
EXAMPLE = Path(__file__).parent.parent / "docs" / "frameworks" / "pipecat.md"
SILENCE = bytes(2 * 24_000)  # a second of 24 kHz PCM16
SENTENCE = "What is the weather like in Paris today?"


async def run_pipecat(script: Path, *args: str) -> str:
    """What `script` printed, run by the pipecat environment's Python; its log is in the failure
    when it does not finish."""
    python = os.path.join(agent_env("pipecat"), "bin", "python")
    process = await asyncio.create_subprocess_exec(
        python, str(script), *args, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
    )
    try:
        async with asyncio.timeout(90):
            out, err = await process.communicate()
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()
    assert process.returncode == 0, err.decode()[-4000:]
    return out.decode()


def realtime_url(server: RunningServer) -> str:
    return server.url.replace("http://", "ws://") + "/v1/realtime"


@pytest.mark.media
@pytest.mark.usefixtures("espeak_ng")
async def test_pipecat_agent_calls_its_tool_hears_speech_and_answers_typed_text(
    server: RunningServer, tmp_path: Path
) -> None:
    spoken = speech24k(SENTENCE)
    speech = tmp_path / "speech.pcm"
    speech.write_bytes(SILENCE + spoken + SILENCE)

    out = await run_pipecat(AGENT, realtime_url(server), str(speech))
    turns = {turn["name"]: turn for turn in map(json.loads, out.splitlines())}

    tool = turns["tool"]
    assert tool["calls"] == [{"name": "get_weather", "arguments": {"city": "Paris"}}]
    assert "22C" in tool["reply"]["text"] and tool["reply"]["speech_bytes"] > 0

    # The server's VAD cut the turn at the sentence: what the bot heard is about as long as it.
    heard = re.search(r"I heard ([\d.]+) seconds of audio", turns["audio"]["reply"]["text"])
    assert heard is not None, turns["audio"]
    assert abs(float(heard.group(1)) - len(spoken) / 2 / 24_000) < 0.6
    assert turns["audio"]["reply"]["speech_bytes"] > 0

    # pipecat sends a typed message as a system item, so the answer counts it among the earlier
    # items: the tool turn's four (request, call, output, answer), the spoken turn's two, and it.
    assert "I was given 7 earlier conversation items" in turns["text"]["reply"]["text"]


@pytest.mark.media
async def test_the_docs_pipecat_bot_runs_as_written(server: RunningServer, tmp_path: Path) -> None:
    """docs/frameworks/pipecat.md's bot, told this server's address instead of the default one."""
    code = re.search(r"```python\n(.*?)```", EXAMPLE.read_text(), re.S)
    assert code is not None
    bot = tmp_path / "bot.py"
    bot.write_text(code.group(1).replace("ws://127.0.0.1:8080/v1/realtime", realtime_url(server)))

    out = await run_pipecat(bot)

    assert out == 'bot: The tool get_weather returned "22C".\n'
