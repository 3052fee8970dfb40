"""The installed `rtc-omni` command as a user runs it: serve, connect with the client, Ctrl-C."""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import sys
import time
import urllib.request
import wave
from pathlib import Path

import pytest


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture
def served(request: pytest.FixtureRequest):
    port = free_port()
    extra = getattr(request, "param", [])
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "rtc_omni",
            "serve",
            "--port",
            str(port),
            "--synthetic-voice",
            "tone",
            "--synthetic-token-rate",
            "200",
            *extra,
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 20
    while True:
        try:
            with urllib.request.urlopen(url + "/healthz", timeout=1) as response:
                assert json.load(response)["status"] == "ok"
                break
        except OSError:
            assert process.poll() is None, process.stdout.read()
            assert time.monotonic() < deadline, "server did not become ready"
            time.sleep(0.1)
    yield url, process
    if process.poll() is None:
        process.kill()
        process.wait()


def test_client_command_prints_the_answer_and_saves_the_talker(served, tmp_path: Path) -> None:
    url, _ = served
    wav_path = tmp_path / "talker.wav"
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "rtc_omni",
            "client",
            "understand",
            "--server",
            url,
            "--video",
            "colour:blue",
            "--audio",
            "tone:660",
            "--width",
            "320",
            "--height",
            "240",
            "--query",
            "What colour?",
            "--save-audio",
            str(wav_path),
            "--warmup",
            "1",
        ],
        capture_output=True,
        text=True,
        timeout=90,
    )
    assert done.returncode == 0, done.stderr
    assert "mostly blue" in done.stdout and "about 660 Hz" in done.stdout
    assert "first text" in done.stdout
    with wave.open(str(wav_path)) as wav:
        assert wav.getframerate() == 48000 and wav.getnframes() > 48000


def test_ctrl_c_closes_open_sessions_and_exits(served) -> None:
    url, process = served
    client = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "rtc_omni",
            "client",
            "understand",
            "--server",
            url,
            "--video",
            "testsrc",
            "--width",
            "320",
            "--height",
            "240",
            "--query",
            "hello",
            "--warmup",
            "30",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        # Wait for the client to report its connection (not just its session being registered): a
        # connection still being set up when the server stops is aiortc's to abort, noisily.
        assert client.stdout is not None
        line = client.stdout.readline()
        assert line.startswith("connected in"), line
        process.send_signal(signal.SIGINT)
        output, _ = process.communicate(timeout=15)
        assert process.returncode == 0, output
        assert "connection closed" in output
        assert "Task was destroyed" not in output and "Traceback" not in output
    finally:
        client.kill()
        client.wait()


def test_generate_command_receives_and_writes_the_video(served, tmp_path: Path) -> None:
    import av

    url, _ = served
    out = tmp_path / "received.mp4"
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "rtc_omni",
            "client",
            "generate",
            "--server",
            url,
            "--prompt",
            "a red kite",
            "--size",
            "320x240",
            "--fps",
            "16",
            "--frames",
            "40",
            "--out",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=90,
    )
    assert done.returncode == 0, done.stderr
    assert "received 40 frames of 320x240" in done.stdout and "first frame after" in done.stdout
    with av.open(str(out)) as container:
        assert sum(1 for _ in container.decode(video=0)) == 40


@pytest.mark.parametrize("served", [["--log-format", "json"]], indirect=True)
def test_json_logs_name_the_session_on_every_session_line(served) -> None:
    url, process = served
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "rtc_omni",
            "client",
            "understand",
            "--server",
            url,
            "--video",
            "colour:red",
            "--audio",
            "none",
            "--width",
            "160",
            "--height",
            "120",
            "--query",
            "hi",
            "--config",
            '{"modalities": ["text"]}',  # a test about logs: no talker to wait for
            "--warmup",
            "0.5",
        ],
        capture_output=True,
        text=True,
        timeout=90,
    )
    assert done.returncode == 0, done.stderr
    session_id = done.stdout.split("session ", 1)[1].split()[0]
    process.send_signal(signal.SIGINT)
    output, _ = process.communicate(timeout=15)
    lines = [json.loads(line) for line in output.splitlines() if line.startswith("{")]
    assert lines and all({"ts", "level", "logger", "session_id", "message"} <= line.keys() for line in lines)
    mine = [line for line in lines if line["session_id"] == session_id]
    assert any("connection connected" in line["message"] for line in mine)
    assert any(line["logger"].startswith("aioice") for line in mine)  # aioice's own lines carry it too
