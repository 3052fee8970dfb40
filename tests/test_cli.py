"""The installed `rtc-omni` command as a user runs it: serve, connect with the client, Ctrl-C,
README's quickstart, and the message each mistake gets.

The commands that serve, stream or stop run as processes (`python -m rtc_omni`); the mistakes,
`--help` and the refusals the client reports call the same `main(argv)` in this process
(`run_cli`), as each process start costs more than a second of imports.
"""

from __future__ import annotations

import contextlib
import io
import json
import logging
import os
import re
import shlex
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
import wave
from pathlib import Path
from unittest import mock

import numpy as np
import pytest

from rtc_omni.cli import ice_warning, main
from rtc_omni.config import Settings

from .https_server import self_signed
from .tools import free_port, require_tool

README = Path(__file__).resolve().parent.parent / "README.md"
RTC_OMNI = [sys.executable, "-m", "rtc_omni"]  # the `rtc-omni` console script, from this source tree


def start_server(
    *args: str, cwd: Path | None = None, log: Path | None = None, env: dict[str, str] | None = None
) -> tuple[str, subprocess.Popen[str]]:
    """`rtc-omni serve ARGS --port FREE`, once it answers /healthz; its output to `log` when one is
    given (a debug log outgrows a pipe nobody reads), else to a pipe; `env` added to this one's."""
    port = free_port()
    process = subprocess.Popen(
        [*RTC_OMNI, "serve", *args, "--port", str(port)],
        stdout=subprocess.PIPE if log is None else log.open("w"),
        stderr=subprocess.STDOUT,
        text=True,
        cwd=cwd,
        env=None if env is None else {**os.environ, **env},
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
    return url, process


def stop(process: subprocess.Popen[str]) -> None:
    if process.poll() is None:
        process.kill()
        process.wait()


SERVE_FAST = ("--synthetic-voice", "tone", "--synthetic-token-rate", "200")


@pytest.fixture
def served(request: pytest.FixtureRequest):
    """A server of this test's own (it stops it, or passes flags as the fixture's param)."""
    url, process = start_server(*SERVE_FAST, *getattr(request, "param", []))
    yield url, process
    stop(process)


@pytest.fixture(scope="module")
def shared_server():
    """One server for the tests that only connect to it; each client's session ends with its command."""
    url, process = start_server(*SERVE_FAST)
    yield url
    stop(process)


def wait_for_text(log: Path, text: str, timeout: float = 20.0) -> str:
    """The log's content once `text` is in it."""
    deadline = time.monotonic() + timeout
    while text not in (content := log.read_text()):
        assert time.monotonic() < deadline, f"{text!r} not logged within {timeout} s:\n{content[-2000:]}"
        time.sleep(0.1)
    return content


def readme_command(program: str) -> list[str]:
    """The first shell line of README's quickstart that runs `program` (e.g. `rtc-omni client`), as argv."""
    quickstart = README.read_text().split("## Quickstart", 1)[1].split("\n## ", 1)[0]
    shell_lines = [line for block in quickstart.split("```sh\n")[1:] for line in block.split("```")[0].splitlines()]
    for line in shell_lines:
        if program in line:
            words = shlex.split(line.split("&&")[-1])
            assert words[0] == "rtc-omni", line
            return [*RTC_OMNI, *words[1:]]
    raise AssertionError(f"README's quickstart has no {program!r} command")


@pytest.mark.slow  # the whole spoken answer, in real time
def test_readme_quickstart_works_as_written_with_a_spoken_answer(tmp_path: Path) -> None:
    """README's two commands verbatim (the server on a free port, so the client is told where), on
    the default voice: espeak-ng, whose spoken answer lasts far longer than its text."""
    require_tool("espeak-ng", "apt-get install espeak-ng")
    serve = readme_command("rtc-omni serve")
    url, server = start_server(*serve[len(RTC_OMNI) + 1 :], cwd=tmp_path)
    try:
        done = subprocess.run(
            [*readme_command("rtc-omni client"), "--server", url],
            capture_output=True,
            text=True,
            timeout=120,
            cwd=tmp_path,
        )
    finally:
        stop(server)
    assert done.returncode == 0, done.stdout + done.stderr
    answer = done.stdout.split("> What do you see and hear?", 1)[1]
    assert "mostly red" in answer and re.search(r"about (43\d|44\d) Hz", answer), answer
    assert "first audio" in answer and "talker audio saved to talker.wav" in done.stdout
    with wave.open(str(tmp_path / "talker.wav")) as wav:
        pcm = np.frombuffer(wav.readframes(wav.getnframes()), dtype="<i2")
        rate = wav.getframerate()
    voiced_seconds = np.count_nonzero(np.abs(pcm) > 1000) / rate
    assert voiced_seconds > 2, f"{voiced_seconds:.2f} s of speech in talker.wav"


def test_client_command_prints_the_answer_and_saves_the_talker(shared_server: str, tmp_path: Path) -> None:
    url = shared_server
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


def test_generate_command_receives_and_writes_the_video(shared_server: str, tmp_path: Path) -> None:
    import av

    url = shared_server
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


def test_json_logs_name_the_session_on_every_session_line(tmp_path: Path) -> None:
    log = tmp_path / "server.log"
    url, process = start_server(*SERVE_FAST, "--log-format", "json", "--log-level", "debug", log=log)
    try:
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
        view_token = done.stdout.split("access_token=", 1)[1].split()[0]
        with pytest.raises(urllib.error.HTTPError):  # the session has ended: 404, and the token is in the URL
            urllib.request.urlopen(f"{url}/v1/rtc/sessions/{session_id}?access_token={view_token}", timeout=10)
        process.send_signal(signal.SIGINT)
        process.wait(timeout=15)
        output = log.read_text()
        lines = [json.loads(line) for line in output.splitlines() if line.startswith("{")]
        assert lines and all({"ts", "level", "logger", "session_id", "message"} <= line.keys() for line in lines)
        assert view_token not in output and f"/v1/rtc/sessions/{session_id}?access_token=- " in output  # access log
        mine = [line for line in lines if line["session_id"] == session_id]
        assert any("connection connected" in line["message"] for line in mine)
        assert any(line["logger"].startswith("aioice") for line in mine)  # aioice's own lines (debug) carry it too
    finally:
        stop(process)


def run_cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """`rtc-omni ARGS` as `main(ARGS)` in this process, its exit status and output as a process's."""
    stdout, stderr = io.StringIO(), io.StringIO()
    with mock.patch.dict(os.environ, env or {}), contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
        try:
            returncode = main(list(args))
        except SystemExit as stopped:  # argparse: --help, or a flag it refuses
            returncode = stopped.code if isinstance(stopped.code, int) else 1
    return subprocess.CompletedProcess(["rtc-omni", *args], returncode, stdout.getvalue(), stderr.getvalue())


def assert_plain_error(done: subprocess.CompletedProcess[str], expected: str) -> None:
    """A failing command says what is wrong and what to change, in one line a user can act on."""
    assert done.returncode != 0, done.stdout
    assert expected in done.stderr, done.stderr
    for leak in ("validation error", "errors.pydantic.dev", "Traceback", "ssl:default"):
        assert leak not in done.stderr, done.stderr
    assert "engine=" not in done.stdout, "the ready banner came before the error"


@pytest.mark.parametrize(
    ("args", "env", "expected"),
    [
        (["client", "understand", "--server", "127.0.0.1:8080"], {}, "did you mean 'http://127.0.0.1:8080'?"),
        (["client", "understand", "--audio", "tone:abc"], {}, "--audio: 'tone:abc': the tone's frequency must be"),
        (["client", "understand", "--video", "nosuch.mp4"], {}, "--video: 'nosuch.mp4' is not testsrc"),
        (["client", "understand", "--config", '{"num_frames": 0}'], {}, "--config: num_frames should be greater"),
        (["client", "generate", "--prompt", "x", "--size", "100"], {}, "size must be 'WIDTHxHEIGHT'"),
        (["serve"], {"RTC_OMNI_PORT": "abc"}, "--port (RTC_OMNI_PORT) should be a valid integer (got 'abc')."),
        (["serve", "--engine", "remote"], {}, "--engine remote needs at least one --upstream ws://HOST:PORT"),
        (["serve", "--tls-cert", "cert.pem"], {}, "set both --tls-cert and --tls-key, or neither"),
        (
            ["serve", "--tls-cert", "/no/cert.pem", "--tls-key", "/no/key.pem"],
            {},
            "--tls-cert /no/cert.pem: No such file",
        ),
        (["serve", "--trusted-proxy", "proxy.lan"], {}, "--trusted-proxy (RTC_OMNI_TRUSTED_PROXY): 'proxy.lan' is not"),
    ],
)
def test_each_mistake_is_named_with_its_flag(args: list[str], env: dict[str, str], expected: str) -> None:
    assert_plain_error(run_cli(*args, env=env), expected)


def test_a_key_that_is_not_the_certificates_is_named(tmp_path: Path) -> None:
    first, second = self_signed(tmp_path, "first"), self_signed(tmp_path, "second")
    done = run_cli("serve", "--tls-cert", str(first.cert), "--tls-key", str(second.key))
    assert_plain_error(done, f"--tls-key {second.key} is not the private key of --tls-cert {first.cert}")


def test_a_public_host_with_loopback_only_ice_is_warned_about_with_the_flag_to_set() -> None:
    # The port is taken (bound, never listening): the server stops right after the warning.
    with socket.socket() as taken:
        taken.bind(("0.0.0.0", 0))
        port = str(taken.getsockname()[1])
        done = subprocess.run(
            [*RTC_OMNI, "serve", "--host", "0.0.0.0", "--port", port], capture_output=True, text=True, timeout=60
        )
    assert "warning: --host 0.0.0.0 takes requests from other machines, but ICE gathers on loopback only" in done.stderr
    assert "Set --ice-address to an address of this machine they reach" in done.stderr
    assert ice_warning(Settings(host="0.0.0.0", ice_address=["all"])) is None  # ICE on every interface: no warning
    assert ice_warning(Settings()) is None  # all on loopback: nothing to warn about


def test_a_busy_port_is_named_and_no_ready_banner_is_printed() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        # a process: serve configures logging for the whole process, and the banner is printed past it
        done = subprocess.run([*RTC_OMNI, "serve", "--port", str(port)], capture_output=True, text=True, timeout=60)
    assert_plain_error(done, f"127.0.0.1:{port} is already in use")
    assert "--port" in done.stderr


def test_a_server_that_is_not_running_is_named() -> None:
    url = f"http://127.0.0.1:{free_port()}"
    done = run_cli("client", "understand", "--server", url, "--query", "hi")
    assert_plain_error(done, f"cannot connect to {url}: is `rtc-omni serve` running there?")


def test_help_shows_defaults_and_explains_every_flag() -> None:
    understand = run_cli("client", "understand", "--help").stdout
    assert "(default: 640)" in understand and "(default: http://127.0.0.1:8080)" in understand
    for flag in ("--width WIDTH", "--height HEIGHT", "--fps FPS"):
        assert re.search(re.escape(flag) + r"\s+\w", understand), f"{flag} has no help"
    assert "Default: 8080." in run_cli("serve", "--help").stdout


def test_an_answer_longer_than_the_timeout_is_reported_after_its_text(shared_server: str) -> None:
    """--timeout bounds the whole turn; the text is shown as it streams, before the speech ends."""
    url = shared_server
    done = run_cli(
        "client", "understand", "--server", url, "--video", "colour:green", "--audio", "none",
        "--width", "160", "--height", "120", "--warmup", "0.5", "--query", "hi", "--timeout", "3",
    )  # fmt: skip
    assert_plain_error(done, "the answer's speech did not finish playing within 3 s (--timeout)")
    assert "mostly green" in done.stdout


@pytest.mark.parametrize("served", [["--auth-token", "s3cret"]], indirect=True)
def test_a_missing_token_is_named_with_the_flag_to_pass(served) -> None:
    url, _ = served
    done = run_cli("client", "understand", "--server", url, "--video", "none", "--audio", "none", "--query", "hi")
    assert_plain_error(done, "the server refused the session (HTTP 401): missing or wrong bearer token")
    assert "as --token" in done.stderr


def test_a_real_model_name_on_the_synthetic_engine_is_warned_about() -> None:
    with socket.socket() as taken:  # a busy port: the server stops right after its start-up checks
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        args = [*RTC_OMNI, "serve", "--port", str(port), "--model", "Qwen/Qwen3-Omni-30B-A3B-Instruct"]
        done = subprocess.run(args, capture_output=True, text=True, timeout=60)
    assert "warning: --model Qwen/Qwen3-Omni-30B-A3B-Instruct only names the model" in done.stderr
    assert "--engine vllm" in done.stderr


def test_sigusr1_logs_the_top_allocation_sites_and_what_grew_since(tmp_path: Path) -> None:
    log = tmp_path / "server.log"
    url, process = start_server(*SERVE_FAST, log=log, env={"PYTHONTRACEMALLOC": "1"})
    try:
        process.send_signal(signal.SIGUSR1)
        wait_for_text(log, "top 20 by size:")
        urllib.request.urlopen(url + "/healthz", timeout=10).read()
        process.send_signal(signal.SIGUSR1)
        output = wait_for_text(log, "grown since the last SIGUSR1")
        urllib.request.urlopen(url + "/healthz", timeout=10).read()  # still serving
    finally:
        stop(process)
    top, grown = output.split("top 20 by size:")[1], output.split("grown since the last SIGUSR1")[1]
    site = r" +\d+\. +{sign}[\d.]+ KiB +{sign}\d+ blocks  .+:\d+"  # rank, size, blocks, file:line
    assert len([line for line in top.splitlines() if re.fullmatch(site.format(sign=""), line)]) == 20
    assert any(re.fullmatch(site.format(sign=r"\+"), line) for line in grown.splitlines())


def test_sigusr1_without_tracemalloc_says_how_to_turn_it_on(tmp_path: Path) -> None:
    log = tmp_path / "server.log"
    url, process = start_server(*SERVE_FAST, log=log)
    try:
        process.send_signal(signal.SIGUSR1)
        wait_for_text(log, "start the server with PYTHONTRACEMALLOC=1")
        urllib.request.urlopen(url + "/healthz", timeout=10).read()  # still serving
    finally:
        stop(process)


def test_ice_chatter_stays_out_of_the_default_logs_and_returns_at_debug() -> None:
    from rtc_omni.logs import configure_logging

    try:
        configure_logging("info", "text")
        assert not logging.getLogger("aioice.ice").isEnabledFor(logging.INFO)
        assert logging.getLogger("aioice.ice").isEnabledFor(logging.WARNING)
        assert logging.getLogger("rtc_omni.sessions.realtime").isEnabledFor(logging.INFO)
        configure_logging("debug", "text")
        assert logging.getLogger("aiortc.rtcpeerconnection").isEnabledFor(logging.DEBUG)
    finally:
        configure_logging("warning", "text")
