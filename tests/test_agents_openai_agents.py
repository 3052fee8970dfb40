"""openai-agents 0.24 (`RealtimeAgent` + `RealtimeRunner` over WebSocket), unchanged but for its URL
and key, holds a conversation with `/v1/realtime`: a typed question, a spoken one ended by the server's
VAD, and a tool round trip. The agent runs in its own environment (tests/agents/openai-agents/), as
tests/agents/openai-agents/voice_agent.py, which prints what its user sees of each turn. The
framework validates every server event against its own `openai` types and reports one that fails as
an error, which fails the run.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
from pathlib import Path
from typing import Any

import pytest

from .conftest import RunningServer
from .realtime_client import speech24k
from .tools import agent_env, require_loopback_namespace

pytestmark = [pytest.mark.media, pytest.mark.usefixtures("espeak_ng")]

AGENT = Path(__file__).resolve().parent / "agents" / "openai-agents" / "voice_agent.py"
SPOKEN = "What is the weather in Paris today?"


async def run_agent(server: RunningServer, speech_file: Path) -> dict[str, dict[str, Any]]:
    """voice_agent.py's turns by name, once it has finished all three."""
    python = os.path.join(agent_env("openai-agents"), "bin", "python")
    url = server.url.replace("http://", "ws://") + "/v1/realtime"
    process = await asyncio.create_subprocess_exec(
        python, str(AGENT), url, str(speech_file), stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
    )
    stdout, stderr = await asyncio.wait_for(process.communicate(), 100)
    assert process.returncode == 0, stderr.decode()[-3000:]
    return {turn["turn"]: turn for turn in map(json.loads, stdout.decode().splitlines())}


async def test_voice_agent_answers_typed_and_spoken_questions_and_uses_its_tool(
    server: RunningServer, tmp_path: Path
) -> None:
    require_loopback_namespace()  # the framework's own code runs here: it must reach nothing but 127.0.0.1
    speech = speech24k(SPOKEN)
    (tmp_path / "speech.pcm").write_bytes(speech)
    turns = await run_agent(server, tmp_path / "speech.pcm")

    assert 'You asked: "What colour is the sky?"' in turns["text"]["answer"]

    # The agent heard the utterance the VAD cut from the stream (not the silence after it) and was
    # told what it said: the framework's default input transcription is on.
    heard = re.search(r"I heard ([\d.]+) seconds of audio", turns["audio"]["answer"])
    assert heard and abs(float(heard[1]) - len(speech) / 2 / 24_000) < 0.5, turns["audio"]["answer"]
    words = set(re.findall(r"[a-z]+", turns["audio"]["transcript"].lower()))
    assert len(words & {"what", "weather", "paris", "today"}) >= 3, turns["audio"]["transcript"]

    tool = turns["tool"]
    assert (tool["tool"], tool["arguments"], tool["output"]) == ("get_weather", {"city": "Paris"}, "22C")
    assert "22C" in tool["answer"]
