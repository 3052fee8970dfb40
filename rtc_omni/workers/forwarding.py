"""A request for another worker's session goes to that worker, over its private Unix socket.

The kernel hands each new connection on the shared port to any worker (SO_REUSEPORT), but a
session's media (its aiortc peer, its viewers, its recording) lives in the worker that answered its
offer. That worker's index is the session id's prefix (identity.py), so the worker that got the
request forwards it to the owner's socket and relays the answer verbatim: status, headers
(Location, ETag, tokens...) and body, streamed. The owner serves it with its full middleware chain,
so access checks, CORS and limits are the same wherever the request landed.

The sockets live in a folder only this user can open (mode 0700), so the header carrying the
client's address is believed only on a request that came through one.
"""

from __future__ import annotations

import logging

import aiohttp
from aiohttp import web
from aiohttp.typedefs import Handler, Middleware
from multidict import CIMultiDict

from ..protocol.codec import load_json
from ..signaling.client_secrets import KEY_PREFIX, EphemeralKeys, Grant
from .identity import Worker
from .scrape import METRICS_PATH, WholeServerScrape

logger = logging.getLogger(__name__)

FORWARDED_FOR = "RTC-Omni-Forwarded-For"
FORWARDED_ORIGIN = "RTC-Omni-Forwarded-Origin"  # the scheme://host its client used (signaling/public_url.py)
REDEEM_PATH = "/_workers/redeem"  # an ephemeral key, redeemed (POST) or given back (PUT) at its minter
ATTACH_PATH = "/v1/rtc/offer"  # kind "control" names its session in the body, not the path
# Headers about one hop's connection, not the message; aiohttp sets its own for each side.
_HOP_BY_HOP = frozenset(
    h.lower()
    for h in (
        "Connection",
        "Keep-Alive",
        "Transfer-Encoding",
        "TE",
        "Trailer",
        "Upgrade",
        "Proxy-Authorization",
        "Proxy-Authenticate",
        "Content-Length",
        FORWARDED_FOR,
        FORWARDED_ORIGIN,
    )
)
FORWARD_TIMEOUT = aiohttp.ClientTimeout(total=None, sock_connect=5, sock_read=120)
REDEEM_TIMEOUT = aiohttp.ClientTimeout(total=5)
RELAY_CHUNK_BYTES = 64 * 1024


def _came_from_sibling(request: web.Request) -> bool:
    return request.transport is not None and not isinstance(request.transport.get_extra_info("peername"), tuple)


def sibling_client_address() -> Middleware:
    """Outermost: a request a sibling forwarded is seen with its client's address (for the
    per-client limits and logs), not the Unix socket's empty one, and with the scheme and host its
    client used (for the URLs in the answer: an https client's Location stays https)."""

    @web.middleware
    async def restore_remote(request: web.Request, handler: Handler) -> web.StreamResponse:
        client = request.headers.get(FORWARDED_FOR)
        if client and _came_from_sibling(request):
            scheme, _, host = request.headers.get(FORWARDED_ORIGIN, "").partition("://")
            origin = request.clone(remote=client, scheme=scheme or request.scheme, host=host or request.host)
            return await handler(origin)
        return await handler(request)

    return restore_remote


async def _addressed_session(request: web.Request) -> str | None:
    """The session a request acts on: its path's {session_id} or {call_id}, or an attach's body."""
    session_id = request.match_info.get("session_id") or request.match_info.get("call_id")
    if session_id is not None or request.path != ATTACH_PATH or request.method != "POST":
        return session_id
    try:  # the body was already read and bounded (limits.text_body); post_offer reports bad ones
        body = load_json(await request.text())
    except ValueError:
        return None
    named = body.get("session_id") if isinstance(body, dict) and body.get("kind") == "control" else None
    return named if isinstance(named, str) else None


class OwnerRouting:
    """Innermost middleware of a worker: serve its own sessions, forward the others' to their owner.

    Ephemeral keys (client_secrets.py) are owned the same way: a key names the worker that minted
    it, and a worker opening a realtime session with another's key has that worker redeem it (once),
    and give it back if the session did not open. The session then lives where its request landed;
    a WebSocket is never forwarded.
    A scrape of /metrics is the whole server's: every worker's figures, merged (scrape.py).
    """

    def __init__(self, worker: Worker, keys: EphemeralKeys) -> None:
        self.worker = worker
        self.keys = keys
        self._clients: dict[int, aiohttp.ClientSession] = {}
        self._scrape = WholeServerScrape(worker, self._client)

    def middleware(self) -> Middleware:
        @web.middleware
        async def route_to_owner(request: web.Request, handler: Handler) -> web.StreamResponse:
            if request.path == METRICS_PATH and request.method in ("GET", "HEAD") and not _came_from_sibling(request):
                return await self._scrape(request)
            session_id = await _addressed_session(request)
            owner = None if session_id is None else self.worker.owner_of(session_id)
            if owner is None or owner == self.worker.index:
                return await handler(request)
            return await self._forward(request, owner)

        return route_to_owner

    def _client(self, owner: int) -> aiohttp.ClientSession:
        if owner not in self._clients:
            connector = aiohttp.UnixConnector(path=str(self.worker.socket_path(owner)))
            self._clients[owner] = aiohttp.ClientSession(
                connector=connector, timeout=FORWARD_TIMEOUT, auto_decompress=False
            )
        return self._clients[owner]

    async def _forward(self, request: web.Request, owner: int) -> web.StreamResponse:
        # aiohttp hands over a request body already decoded, so its Content-Encoding no longer applies.
        dropped = _HOP_BY_HOP | {"content-encoding"}
        headers = CIMultiDict((k, v) for k, v in request.headers.items() if k.lower() not in dropped)
        headers[FORWARDED_FOR] = request.remote or ""
        headers[FORWARDED_ORIGIN] = f"{request.scheme}://{request.host}"
        body = await request.read() if request.body_exists else None  # kept since text_body read it
        url = f"http://worker-{owner}{request.path_qs}"
        try:
            answer = await self._client(owner).request(
                request.method, url, headers=headers, data=body, allow_redirects=False
            )
        except (aiohttp.ClientError, TimeoutError) as exc:
            logger.warning(
                "worker %d could not reach worker %d for %s: %s", self.worker.index, owner, request.path, exc
            )
            return web.json_response(
                {"error": f"the worker that owns this session is unreachable ({exc.__class__.__name__})"}, status=502
            )
        async with answer:  # past this point a failure drops the connection, as the owner's own would
            relayed = web.StreamResponse(
                status=answer.status,
                reason=answer.reason,
                headers=CIMultiDict((k, v) for k, v in answer.headers.items() if k.lower() not in _HOP_BY_HOP),
            )
            if answer.content_length is not None:
                relayed.content_length = answer.content_length
            await relayed.prepare(request)
            async for chunk in answer.content.iter_chunked(RELAY_CHUNK_BYTES):
                await relayed.write(chunk)
            await relayed.write_eof()
        return relayed

    def _sibling_minter(self, key: str) -> int | None:
        """The sibling that minted `key`; None for this worker's keys (and keys no worker made)."""
        owner = self.worker.owner_of(key.removeprefix(KEY_PREFIX))
        return None if owner == self.worker.index else owner

    async def redeem(self, key: str) -> Grant | None:
        """The grant of `key`, redeemed by the worker that minted it; None if it is not valid."""
        owner = self._sibling_minter(key)
        if owner is None:
            return self.keys.redeem(key)
        try:
            async with self._client(owner).post(
                f"http://worker-{owner}{REDEEM_PATH}", data=key, timeout=REDEEM_TIMEOUT
            ) as answer:
                if answer.status != 200:
                    return None
                body = await answer.json()
                return Grant(float(body["expires_at"]), dict(body["config"]))
        except (aiohttp.ClientError, TimeoutError, ValueError, KeyError, TypeError) as exc:
            logger.warning("worker %d could not redeem a key at worker %d: %s", self.worker.index, owner, exc)
            return None

    async def give_back(self, key: str, grant: Grant) -> None:
        """Make `key` valid again at the worker that minted it (a dead one's keys are lost anyway)."""
        owner = self._sibling_minter(key)
        if owner is None:
            self.keys.give_back(key, grant)
            return
        body = {"key": key, "expires_at": grant.expires_at, "config": grant.config}
        try:
            async with self._client(owner).put(
                f"http://worker-{owner}{REDEEM_PATH}", json=body, timeout=REDEEM_TIMEOUT
            ) as answer:
                answer.raise_for_status()
        except (aiohttp.ClientError, TimeoutError) as exc:
            logger.warning("worker %d could not give a key back to worker %d: %s", self.worker.index, owner, exc)

    async def redeem_for_sibling(self, request: web.Request) -> web.Response:
        """POST REDEEM_PATH, from a sibling only: redeem one of this worker's keys."""
        if not _came_from_sibling(request):
            raise web.HTTPNotFound()
        grant = self.keys.redeem(await request.text())
        if grant is None:
            return web.json_response({"error": "unknown, used or expired"}, status=404)
        return web.json_response({"expires_at": grant.expires_at, "config": grant.config})

    async def give_back_for_sibling(self, request: web.Request) -> web.Response:
        """PUT REDEEM_PATH, from a sibling only: one of this worker's keys, whose session did not open."""
        if not _came_from_sibling(request):
            raise web.HTTPNotFound()
        body = await request.json()
        self.keys.give_back(str(body["key"]), Grant(float(body["expires_at"]), dict(body["config"])))
        return web.Response(status=204)

    async def close(self, _app: web.Application | None = None) -> None:
        for client in self._clients.values():
            await client.close()
        self._clients.clear()
