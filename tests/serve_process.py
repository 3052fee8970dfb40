"""`rtc-omni serve` as a real process on 127.0.0.1 (one, or several gateways of a fleet), and the
plain HTTP calls tests make to it, each on a new connection."""

from __future__ import annotations

import os
import re
import select
import subprocess
import sys
import time
from pathlib import Path

import aiohttp

BANNER = re.compile(r"on (http://127\.0\.0\.1:\d+)")


class Served:
    def __init__(self, process: subprocess.Popen[str], url: str, log: Path) -> None:
        self.process, self.url, self.log = process, url, log

    def worker_pids(self) -> list[int]:
        children = Path(f"/proc/{self.process.pid}/task/{self.process.pid}/children").read_text()
        return [int(pid) for pid in children.split()]

    def worker_pid(self, index: int, not_pid: int | None = None, timeout: float = 10) -> int:
        """The pid of worker `index` (other than `not_pid`, one just killed) once it listens on its
        Unix socket, `worker-I.sock`: the process holding that socket."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            inodes = {
                f"socket:[{fields[6]}]"
                for fields in (line.split() for line in Path("/proc/net/unix").read_text().splitlines()[1:])
                if len(fields) > 7 and fields[7].endswith(f"/worker-{index}.sock")
            }
            for pid in set(self.worker_pids()) - {not_pid}:
                try:
                    if inodes & {os.readlink(fd) for fd in Path(f"/proc/{pid}/fd").iterdir()}:
                        return pid
                except FileNotFoundError:  # it ended meanwhile
                    continue
            time.sleep(0.05)
        raise AssertionError(f"worker {index} is not listening after {timeout} s")


def start_serve(tmp_path: Path, *args: str, name: str = "server") -> Served:
    """`rtc-omni serve --port 0 ARGS`, once its banner (printed when every worker listens) is out; its
    log is `tmp_path/NAME.log`."""
    log = tmp_path / f"{name}.log"
    process = subprocess.Popen(
        [sys.executable, "-m", "rtc_omni", "serve", "--port", "0", "--session-rate-limit", "0", *args],
        stdout=subprocess.PIPE,
        stderr=log.open("w"),
        text=True,
    )
    assert process.stdout is not None
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        readable, _, _ = select.select([process.stdout], [], [], 1.0)
        line = process.stdout.readline() if readable else ""
        if match := BANNER.search(line):
            return Served(process, match.group(1), log)
        assert process.poll() is None, log.read_text()
    process.kill()
    raise AssertionError(f"no banner within 30 s: {log.read_text()}")


async def call(method: str, url: str, token: str | None, headers: dict[str, str] | None = None) -> int:
    """One request on its own connection (a new one: the kernel may give it to either worker)."""
    headers = {**({"Authorization": f"Bearer {token}"} if token else {}), **(headers or {})}
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(force_close=True)) as http:
        async with http.request(method, url, headers=headers) as response:
            await response.read()
            return response.status


async def open_realtime(url: str, key: str) -> str | int:
    """Open WS /v1/realtime with an ephemeral key: its first event's type and instructions (or
    message, for an error), or the refusal's status."""
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(force_close=True)) as http:
        try:
            async with http.ws_connect(
                url.replace("http", "ws") + "/v1/realtime?model=qwen3-omni", headers={"Authorization": f"Bearer {key}"}
            ) as ws:
                first = await ws.receive_json(timeout=10)
                said = first["message"] if first["type"] == "error" else first["session"]["instructions"]
                return f"{first['type']}: {said}"
        except aiohttp.WSServerHandshakeError as exc:
            return exc.status


async def mint_key(url: str, instructions: str) -> str:
    """POST /v1/realtime/client_secrets on a new connection (either worker may mint it)."""
    body = {"session": {"type": "realtime", "instructions": instructions}}
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(force_close=True)) as http:
        async with http.post(f"{url}/v1/realtime/client_secrets", json=body) as response:
            assert response.status == 200
            return str((await response.json())["value"])
