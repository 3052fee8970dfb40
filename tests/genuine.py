"""vLLM-Omni 0.30's genuine WebSocket handlers as tests meet them: tests/vllm_cpu/genuine_server.py in
the vLLM-Omni environment (fake engines, no model), a forwarder that drops its connections, and
gateways (`--engine remote`) in front of them."""

from __future__ import annotations

import asyncio
import contextlib
import copy
import os
import subprocess
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import aiohttp

from rtc_omni.config import Settings

from .conftest import FAST_SETTINGS, RunningServer, ServerFactory
from .tools import require_loopback_namespace, unavailable

SCRIPT = Path(__file__).resolve().parent / "vllm_cpu" / "genuine_server.py"
START_TIMEOUT_S = 180.0  # importing vLLM on a busy 2-core machine


class Genuine:
    """One genuine_server.py process on 127.0.0.1."""

    def __init__(self, *args: str) -> None:
        python = os.environ.get("RTC_OMNI_VLLM_PYTHON")
        if not python:
            unavailable("RTC_OMNI_VLLM_PYTHON names no vLLM-Omni environment (tests/vllm_cpu/env.sh builds one)")
        require_loopback_namespace()
        self.log = tempfile.NamedTemporaryFile("w+", prefix="genuine-", suffix=".log")  # noqa: SIM115
        self.process = subprocess.Popen(
            [python, str(SCRIPT), "--port", "0", *args],
            stdout=self.log,
            stderr=subprocess.STDOUT,
            env={**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": ""},
        )
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:
            lines = Path(self.log.name).read_text().splitlines()
            port = next((line.split()[-1] for line in lines if line.startswith("listening on")), None)
            if port is not None:
                break
            if self.process.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError("genuine_server.py did not start:\n" + "\n".join(lines[-30:]))
            time.sleep(0.2)
        self.url = f"ws://127.0.0.1:{port}"
        self.http = f"http://127.0.0.1:{port}"

    def under(self, prefix: str) -> Genuine:
        """The same server, addressed under a path prefix (its record stays at the root)."""
        view = copy.copy(self)
        view.url = self.url + prefix
        return view

    async def record(self) -> dict[str, list[Any]]:
        async with aiohttp.ClientSession() as http:
            async with http.get(self.http + "/test/record") as response:
                return await response.json()

    async def wait_record(self, where: Callable[[dict[str, list[Any]]], bool], timeout: float = 10.0) -> dict:
        async with asyncio.timeout(timeout):
            while not where(record := await self.record()):
                await asyncio.sleep(0.05)
        return record

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self.log.close()


class Vanishing:
    """A TCP forwarder on 127.0.0.1 to an upstream: an upstream that `vanish()`es as a killed process
    does (its connections drop, new ones are refused), or whose connections `drop()`, without starting
    a second vLLM-Omni server (~20 CPU-s of imports)."""

    def __init__(self, target: Genuine | RunningServer) -> None:
        self.target_port = int(target.url.rsplit(":", 1)[1])
        self.transports: list[asyncio.BaseTransport] = []
        self.pipes: set[asyncio.Task[None]] = set()

    async def start(self) -> str:
        self.server = await asyncio.start_server(self._accept, "127.0.0.1", 0)
        return f"ws://127.0.0.1:{self.server.sockets[0].getsockname()[1]}"

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.target_port)
        self.transports += [writer.transport, up_writer.transport]
        for source, sink in ((reader, up_writer), (up_reader, writer)):
            task = asyncio.ensure_future(self._pipe(source, sink))
            self.pipes.add(task)
            task.add_done_callback(self.pipes.discard)

    @staticmethod
    async def _pipe(source: asyncio.StreamReader, sink: asyncio.StreamWriter) -> None:
        with contextlib.suppress(ConnectionError):
            while data := await source.read(65536):
                sink.write(data)
                await sink.drain()
        sink.close()

    async def drop(self) -> None:
        """Cut the connections open now, as a network change does; new ones still get through."""
        for transport in self.transports:
            transport.abort()
        self.transports.clear()
        for task in list(self.pipes):
            task.cancel()
        await asyncio.gather(*self.pipes, return_exceptions=True)

    async def vanish(self) -> None:
        self.server.close()
        await self.drop()
        await self.server.wait_closed()


async def gateway_to(make_server: ServerFactory, *upstreams: str, **overrides: Any) -> RunningServer:
    """`rtc-omni serve --engine remote --upstream ...` (without --model), in this process."""
    settings = Settings(**{**FAST_SETTINGS, **overrides}, engine="remote", upstream=list(upstreams), upstream_retry=60)
    return await make_server(settings=settings)
