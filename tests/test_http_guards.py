"""HTTP-level guards: RFC 9110 Bearer parsing, the session rate limit on WebSockets too, bodies that
are not what an endpoint takes, slow clients, connections per client address, and a fuzz proving
that no request gets a 500."""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import AsyncIterator

import aiohttp
import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from rtc_omni.app import create_app, serve
from rtc_omni.config import Settings
from rtc_omni.engines import create_engines
from rtc_omni.signaling.client_secrets import EPHEMERAL_KEYS

from .conftest import FAST_SETTINGS, RunningServer, ServerFactory, http_json

TOKEN = "s3cret"


@pytest.mark.parametrize("header", [f"bearer {TOKEN}", f"BEARER {TOKEN}", f"Bearer  {TOKEN}", f" Bearer {TOKEN} "])
async def test_the_bearer_scheme_is_case_insensitive_and_takes_any_spaces(
    make_server: ServerFactory, header: str
) -> None:
    server = await make_server(auth_token=TOKEN)
    status, body = await http_json(server, "GET", "/v1/rtc/sessions/nope", headers={"Authorization": header})
    assert status == 404, body  # past the token check


@pytest.mark.parametrize("header", [f"Basic {TOKEN}", f"Bearer{TOKEN}", "Bearer", f"Bearer {TOKEN}x", ""])
async def test_anything_but_the_bearer_token_is_refused(make_server: ServerFactory, header: str) -> None:
    server = await make_server(auth_token=TOKEN)
    status, _ = await http_json(server, "GET", "/v1/rtc/sessions/nope", headers={"Authorization": header})
    assert status == 401


async def test_websocket_sessions_count_against_the_session_rate_limit(make_server: ServerFactory) -> None:
    server = await make_server(session_rate_limit=2)
    url = server.url.replace("http://", "ws://")
    async with aiohttp.ClientSession() as http:
        first = await http.ws_connect(url + "/v1/video/chat/stream")
        second = await http.ws_connect(url + "/v1/realtime/video")
        with pytest.raises(aiohttp.WSServerHandshakeError) as refused:
            await http.ws_connect(url + "/v1/video/chat/stream")
        assert refused.value.status == 429
        await first.close()
        await second.close()


async def test_realtime_sessions_count_against_the_session_rate_limit(make_server: ServerFactory) -> None:
    """Before, with a limit of 5 a minute, 15 of 15 realtime WebSockets and 8 of 8 calls were accepted."""
    server = await make_server(session_rate_limit=3)
    realtime_ws, sdp = server.url.replace("http://", "ws://") + "/v1/realtime?model=m", {"Content-Type": SDP}
    calls = ("/v1/realtime/calls", "/v1/realtime?model=m")
    async with aiohttp.ClientSession() as http:
        async with http.post(server.url + "/v1/realtime/client_secrets", json={}) as response:
            key = (await response.json())["value"]
        first = await http.ws_connect(realtime_ws)
        for path in calls:  # a bad offer counts as a good one
            async with http.post(server.url + path, data="not sdp", headers=sdp) as response:
                assert response.status == 400
        with pytest.raises(aiohttp.WSServerHandshakeError) as refused:
            await http.ws_connect(realtime_ws, headers={"Authorization": f"Bearer {key}"})
        assert refused.value.status == 429
        for path in calls:
            async with http.post(server.url + path, data="not sdp", headers=sdp) as response:
                assert response.status == 429 and int(response.headers["Retry-After"]) >= 1
        async with http.delete(server.url + "/v1/realtime/calls/nope") as response:
            assert response.status == 401  # not 429: hanging up opens nothing (it needs the call's token)
        await first.close()
    assert server.app[EPHEMERAL_KEYS].redeem(key) is not None  # the refused request did not use the key up


JSON = {"Content-Type": "application/json"}
SDP = "application/sdp"
DEEP = b'{"a":' * 300 + b"1" + b"}" * 300  # pydantic serialises 255 levels at most
FORM = {"Content-Type": "multipart/form-data; boundary=b"}


def call_form(session: bytes) -> bytes:
    """A realtime call's multipart body: an SDP part and a `session` part."""
    part = b'--b\r\nContent-Disposition: form-data; name="%s"\r\n\r\n%s\r\n'
    return part % (b"sdp", b"v=0") + part % (b"session", session) + b"--b--\r\n"


BAD_BODIES = [
    ("/v1/rtc/offer", JSON, b"[" * 100_000 + b"]" * 100_000, 400, "must be JSON"),
    ("/v1/rtc/offer", JSON, b'{"sdp": "v=0", "type": "offer", "x": ' + DEEP + b"}", 400, "nested deeper than 64"),
    ("/v1/realtime/client_secrets", JSON, b'{"session": ' + DEEP + b"}", 400, "nested deeper than 64"),
    ("/v1/realtime/client_secrets", JSON, b'{"session": {"x": ' + DEEP + b"}}", 400, "nested deeper than 64"),
    ("/v1/realtime/calls", FORM, call_form(DEEP), 400, "nested deeper than 64"),
    ("/v1/rtc/offer", {"Content-Type": "text/plain"}, b'{"sdp": "v=0", "type": "offer"}', 415, "application/json"),
    ("/v1/rtc/offer", {"Content-Type": "application/json; charset=x-bogus"}, b"{}", 415, "unknown charset"),
    ("/v1/rtc/offer", JSON, b'{"sdp": "\xff\xfe", "type": "offer"}', 400, "not valid utf-8"),
    ("/whip", {"Content-Type": "application/sdp"}, b"v=0\r\ns=\xff\xfe\r\n", 400, "not valid utf-8"),
    ("/whip", {"Content-Type": "application/sdp; charset=nope"}, b"v=0\r\n", 415, "unknown charset"),
    ("/whip", {"Content-Type": "application/sdp; charset=utf-16"}, b"v=0\r\n\x00\x00", 400, "not valid utf-16"),
]


@pytest.mark.parametrize("path, headers, body, status, message", BAD_BODIES, ids=range(len(BAD_BODIES)))
async def test_bodies_an_endpoint_cannot_take_get_a_4xx_never_a_500(
    server: RunningServer, path: str, headers: dict[str, str], body: bytes, status: int, message: str
) -> None:
    got, reply = await http_json(server, "POST", path, data=body, headers=headers)
    assert got == status and message in reply["error"], reply
    assert len(server.registry) == 0


async def raw_connection(url: str, local: str = "127.0.0.1") -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    host, port = url.removeprefix("http://").rsplit(":", 1)
    return await asyncio.open_connection(host, int(port), local_addr=(local, 0))


async def test_a_client_dribbling_its_headers_is_disconnected(make_server: ServerFactory) -> None:
    server = await make_server(http_idle_timeout=1.0)
    reader, writer = await raw_connection(server.url)
    writer.write(b"GET /healthz HTTP/1.1\r\nHost: x\r\n")

    async def dribble() -> bytes:
        for _ in range(200):  # 40 s of one header byte every 0.2 s, unless the server hangs up
            writer.write(b"X")
            await asyncio.sleep(0.2)
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(0.01):
                    if await reader.read() == b"":
                        return b""
        return b"still open"

    assert await dribble() == b""
    writer.close()


async def test_a_client_dribbling_its_body_gets_408(make_server: ServerFactory) -> None:
    server = await make_server(http_body_timeout=1.0)
    reader, writer = await raw_connection(server.url)
    writer.write(b"POST /whip HTTP/1.1\r\nHost: x\r\nContent-Type: application/sdp\r\nContent-Length: 100\r\n\r\n")
    writer.write(b"v=0\r\n")  # and the other 95 bytes never come
    async with asyncio.timeout(20):
        status_line = await reader.readline()
    assert status_line.startswith(b"HTTP/1.1 408"), status_line
    writer.close()


@contextlib.asynccontextmanager
async def served(**overrides: object) -> AsyncIterator[str]:
    """The server exactly as `rtc-omni serve` runs it (app.serve), on a free loopback port."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    config = Settings(**{**FAST_SETTINGS, "port": port, **overrides})
    task = asyncio.ensure_future(serve(create_app(config, await create_engines(config)), config))
    url = f"http://127.0.0.1:{port}"
    async with asyncio.timeout(10):
        while True:
            try:
                async with aiohttp.ClientSession() as http, http.get(url + "/healthz") as response:
                    if response.status == 200:
                        break
            except aiohttp.ClientConnectionError:
                await asyncio.sleep(0.05)
    try:
        yield url
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


async def test_connections_per_client_address_are_capped_and_others_are_still_served() -> None:
    async with served(max_connections_per_client=4, http_idle_timeout=30.0) as url:
        idle = [await raw_connection(url, local="127.0.0.2") for _ in range(12)]  # a slow client
        refused = 0
        for reader, _writer in idle:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(0.5):
                    refused += (await reader.read()).startswith(b"HTTP/1.1 503")
        assert refused == 8
        async with aiohttp.ClientSession() as http, http.get(url + "/healthz") as response:
            assert response.status == 200  # another client address is served
        for _reader, writer in idle:
            writer.close()
        await asyncio.sleep(0.2)
        reader, writer = await raw_connection(url, local="127.0.0.2")
        writer.write(b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        async with asyncio.timeout(10):
            assert (await reader.read()).startswith(b"HTTP/1.1 200")
        writer.close()


PATHS = [  # weighted towards the endpoints that take a body
    "/v1/rtc/offer",
    "/v1/rtc/offer",
    "/whip",
    "/whip",
    "/whip/abc",
    "/whep/abc",
    "/whep/abc/def",
    "/v1/rtc/sessions/abc",
    "/v1/rtc/sessions/abc/recording",
    "/v1/realtime/calls",
    "/v1/realtime/calls",
    "/v1/realtime",
    "/v1/realtime/client_secrets",
    "/v1/realtime/calls/abc",
    "/healthz",
]
MEDIA_TYPES = [
    "application/json",
    "application/sdp",
    "application/trickle-ice-sdpfrag",
    "text/plain",
    "multipart/form-data",
    "multipart/form-data; boundary=x",
]
CHARSETS = ["", "; charset=utf-8", "; charset=latin-1", "; charset=utf-16", "; charset=bogus"]
bodies = st.one_of(
    st.binary(max_size=300),
    st.text(max_size=300).map(str.encode),
    st.sampled_from([b"v=0\r\nm=audio 9 UDP/TLS/RTP/SAVPF 111\r\na=mid:\r\n", b'{"sdp": "v=0", "type": "offer"}']),
    st.integers(1, 5000).map(lambda depth: b"[" * depth + b"]" * depth),
)
requests = st.tuples(
    st.sampled_from(["POST", "POST", "POST", "PATCH", "GET", "DELETE", "PUT", "OPTIONS"]),
    st.sampled_from(PATHS),
    st.builds(str.__add__, st.sampled_from(MEDIA_TYPES), st.sampled_from(CHARSETS)),
    bodies,
    st.sampled_from([{}, {"If-Match": "*"}, {"If-Match": '"x"'}, {"Origin": "https://evil.example"}]),
)


@settings(
    max_examples=5,
    deadline=None,
    phases=[Phase.generate],
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(st.lists(requests, min_size=40, max_size=40))
def test_no_request_gets_a_500(batch: list[tuple[str, str, str, bytes, dict[str, str]]]) -> None:
    async def run() -> None:
        from aiohttp.test_utils import TestServer

        config = Settings(**{**FAST_SETTINGS, "max_sessions": 4})
        server = TestServer(create_app(config, await create_engines(config)), host="127.0.0.1", port=0)
        await server.start_server()
        try:
            async with aiohttp.ClientSession() as http:
                for method, path, content_type, body, headers in batch:
                    url = str(server.make_url(path))
                    async with http.request(
                        method, url, data=body, headers={"Content-Type": content_type, **headers}
                    ) as response:
                        assert response.status < 500, (method, path, content_type, body[:80], await response.text())
        finally:
            await server.close()

    asyncio.run(run())
