"""A request for another worker's session goes to that worker, over its private Unix socket.

The kernel hands each new connection on the shared port to any worker (SO_REUSEPORT), but a
session's media (its aiortc peer, its viewers, its recording) lives in the worker that answered its
offer. That worker's index is the session id's prefix (identity.py), so the worker that got the
request forwards it to the owner's socket and relays the answer verbatim: status, headers
(Location, ETag, tokens...) and body, streamed. The owner serves it with its full middleware chain,
so access checks, CORS and limits are the same wherever the request landed.

The sockets live in a folder only this user can open (mode 0700), so the header carrying the
client's address is believed only on a request that came through one.

In a fleet (fleet/) the id names its node first (`n0.w1.<random>`): a request for another node's
session goes, by the same relay, to that node's URL, signed with the cluster key; the node that
gets it believes the client's address only on a good signature, refuses a bad one (403), and never
forwards a signed request to another node, so no request goes round in circles.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from typing import Any

import aiohttp
from aiohttp import web
from aiohttp.typedefs import Handler, Middleware
from multidict import CIMultiDict

from ..fleet import Fleet
from ..fleet.signatures import SIGNATURE_HEADER, SIGNATURE_WINDOW_S, signature, signer
from ..protocol.codec import load_json
from ..signaling.client_secrets import KEY_PREFIX, EphemeralKeys, Grant
from .identity import Worker
from .scrape import METRICS_PATH, WholeServerScrape

logger = logging.getLogger(__name__)

FORWARDED_FOR = "RTC-Omni-Forwarded-For"
FORWARDED_ORIGIN = "RTC-Omni-Forwarded-Origin"  # the scheme://host its client used (signaling/public_url.py)
REDEEM_PATH = "/_workers/redeem"  # an ephemeral key, redeemed (POST) or given back (PUT) at its minter
# Set on a request that another gateway forwarded, with a good signature: that node's id.
FORWARDED_BY_NODE = web.RequestKey("forwarded_by_node", str)
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
        SIGNATURE_HEADER,
    )
)
FORWARD_TIMEOUT = aiohttp.ClientTimeout(total=None, sock_connect=5, sock_read=120)
REDEEM_TIMEOUT = aiohttp.ClientTimeout(total=5)
RELAY_CHUNK_BYTES = 64 * 1024
RELAY_WS_TIMEOUT = aiohttp.ClientWSTimeout(ws_receive=None, ws_close=10.0)
RELAY_CLOSE_TIMEOUT_S = 10.0
RELAY_HEARTBEAT_S = 10.0  # an owner gone without a FIN is noticed, and the client's socket dropped
# What the owner checks as it would on the client's own socket: the credentials, the origin (CORS).
RELAYED_WS_HEADERS = ("Authorization", "Origin")


def _came_from_sibling(request: web.Request) -> bool:
    return request.transport is not None and not isinstance(request.transport.get_extra_info("peername"), tuple)


def forwarded_client_address(fleet: Fleet | None) -> Middleware:
    """Outermost: a request another worker or gateway forwarded is seen with its client's address (for
    the per-client limits and logs), not the hop's, and with the scheme and host its client used (for
    the URLs in the answer: an https client's Location stays https). One signed as a gateway's with a
    wrong signature (another cluster key, a client's forgery, a stale time) is refused here, before
    anything acts on it."""
    request_key = None if fleet is None else fleet.request_key

    def as_its_client_sent_it(request: web.Request, client: str | None) -> web.Request:
        scheme, _, host = request.headers.get(FORWARDED_ORIGIN, "").partition("://")
        return request.clone(
            remote=client or request.remote or "", scheme=scheme or request.scheme, host=host or request.host
        )

    @web.middleware
    async def restore_remote(request: web.Request, handler: Handler) -> web.StreamResponse:
        client = request.headers.get(FORWARDED_FOR)
        signed = request.headers.get(SIGNATURE_HEADER)
        if signed is not None:
            node = signer(request_key, signed, request.method, request.path)
            if node is None:
                logger.warning(
                    "refused %s %s from %s: not signed with this fleet's cluster key (or signed over %d s ago)",
                    request.method,
                    request.path,
                    request.remote,
                    SIGNATURE_WINDOW_S,
                )
                return web.json_response({"error": "this request's gateway signature is not valid"}, status=403)
            forwarded = as_its_client_sent_it(request, client)
            forwarded[FORWARDED_BY_NODE] = node
            return await handler(forwarded)
        if client and _came_from_sibling(request):
            return await handler(as_its_client_sent_it(request, client))
        return await handler(request)

    return restore_remote


def _forwarded(request: web.Request) -> bool:
    """Whether a sibling worker or a gateway of the fleet (signed) sent this request."""
    return _came_from_sibling(request) or FORWARDED_BY_NODE in request


def session_id_prefix(worker: Worker | None, fleet: Fleet | None) -> str:
    """What starts the ids of the sessions and keys this process makes: `n0.w1.`, `n0.`, `w1.` or nothing."""
    return (fleet.session_id_prefix if fleet else "") + (worker.session_id_prefix if worker else "")


@dataclass(frozen=True)
class _Hop:
    """Where a request for a session this process does not own goes: a sibling's socket, or a peer gateway."""

    name: str  # "worker 1", "node n0": for the logs
    client: aiohttp.ClientSession
    base_url: str
    signed: bool  # a hop to another gateway carries this node's signature
    socket_path: str | None = None  # a sibling's Unix socket


async def _addressed_session(request: web.Request) -> str | None:
    """The session a request acts on: its path's {session_id} or {call_id}, or the body of an attach or
    a resume."""
    session_id = request.match_info.get("session_id") or request.match_info.get("call_id")
    if session_id is not None or request.path != ATTACH_PATH or request.method != "POST":
        return session_id
    try:  # the body was already read and bounded (limits.text_body); post_offer reports bad ones
        body = load_json(await request.text())
    except ValueError:
        return None
    named = body.get("session_id") if isinstance(body, dict) and body.get("kind") in ("control", "resume") else None
    return named if isinstance(named, str) else None


async def _pass_on(source: Any, sink: Any) -> bool:
    """`source`'s messages to `sink` (either side a WebSocket of aiohttp's server or client) until
    `source` goes: its closing handshake is passed on (False); a connection lost without one, True."""
    while True:
        message = await source.receive()
        if message.type == aiohttp.WSMsgType.TEXT:
            await sink.send_str(message.data)
        elif message.type == aiohttp.WSMsgType.BINARY:
            await sink.send_bytes(message.data)
        elif message.type == aiohttp.WSMsgType.CLOSE:
            await sink.close(code=source.close_code or aiohttp.WSCloseCode.OK)
            return False
        else:
            return True


async def _pump_both_ways(
    client: web.WebSocketResponse, client_transport: asyncio.Transport | None, owner: aiohttp.ClientWebSocketResponse
) -> bool:
    """Relay messages until either side goes. A closing handshake is passed on with its code; True when
    the client's connection was lost without one, which the caller must pass on as a loss too (the
    owner keeps a session whose socket was lost, and ends one whose client closed it)."""
    upward, downward = asyncio.ensure_future(_pass_on(client, owner)), asyncio.ensure_future(_pass_on(owner, client))
    try:
        await asyncio.wait([upward, downward], return_when=asyncio.FIRST_COMPLETED)
        if _lost(upward):
            return True
        if _lost(downward) and client_transport is not None:  # the owner went without a close: so does the client
            client_transport.abort()
        await asyncio.wait([upward, downward], timeout=RELAY_CLOSE_TIMEOUT_S)  # the close passed on
        return False
    finally:
        for task in (upward, downward):
            task.cancel()
        await asyncio.gather(upward, downward, return_exceptions=True)


def _lost(task: asyncio.Future[bool]) -> bool:
    return task.done() and not task.cancelled() and task.exception() is None and task.result()


class OwnerRouting:
    """Innermost middleware of a worker or a fleet's gateway: serve its own sessions, forward the others'
    to their owner (a sibling worker, or another node of the fleet).

    Ephemeral keys (client_secrets.py) are owned the same way: a key names the node and worker that
    minted it, and a process opening a realtime session with another's key has the minter redeem it
    (once), and give it back if the session did not open. The session then lives where its request
    landed; a WebSocket is never forwarded.
    A scrape of /metrics is the whole server's: every worker's figures, merged (scrape.py).
    """

    def __init__(self, keys: EphemeralKeys, worker: Worker | None, fleet: Fleet | None) -> None:
        self.worker = worker
        self.fleet = fleet
        self.keys = keys
        self._clients: dict[str, aiohttp.ClientSession] = {}
        self._scrape = None if worker is None else WholeServerScrape(worker, self._sibling_client)
        parts = ([f"node {fleet.node_id}"] if fleet else []) + ([f"worker {worker.index}"] if worker else [])
        self._name = " ".join(parts)  # for the logs

    def middleware(self) -> Middleware:
        @web.middleware
        async def route_to_owner(request: web.Request, handler: Handler) -> web.StreamResponse:
            is_scrape = request.path == METRICS_PATH and request.method in ("GET", "HEAD")
            if self._scrape is not None and is_scrape and not _came_from_sibling(request):
                return await self._scrape(request)
            session_id = await _addressed_session(request)
            hop = None if session_id is None else self._next_hop(session_id, FORWARDED_BY_NODE in request)
            if hop is None:
                return await handler(request)
            return await self._forward(request, hop)

        return route_to_owner

    def _next_hop(self, owned_id: str, from_a_node: bool) -> _Hop | None:
        """Where a request for `owned_id` (a session id, or a key past its `ek_`) goes; None: served here
        (also for an id nobody here made: its handler answers 404). A request another node forwarded
        never leaves this node again."""
        rest: str | None = owned_id
        if self.fleet is not None:
            peer, rest = self.fleet.owner_of(owned_id)
            if peer is not None and not from_a_node:
                return _Hop(f"node {peer}", self._client(f"node {peer}", None), self.fleet.peers[peer], True)
        if rest is None or self.worker is None:
            return None
        owner = self.worker.owner_of(rest)
        if owner is None or owner == self.worker.index:
            return None
        path = str(self.worker.socket_path(owner))
        return _Hop(f"worker {owner}", self._sibling_client(owner), f"http://worker-{owner}", False, path)

    def _client(self, name: str, socket_path: str | None) -> aiohttp.ClientSession:
        if name not in self._clients:
            connector = aiohttp.TCPConnector() if socket_path is None else aiohttp.UnixConnector(path=socket_path)
            self._clients[name] = aiohttp.ClientSession(
                connector=connector, timeout=FORWARD_TIMEOUT, auto_decompress=False
            )
        return self._clients[name]

    def _sibling_client(self, owner: int) -> aiohttp.ClientSession:
        assert self.worker is not None  # only workers have siblings
        return self._client(f"worker {owner}", str(self.worker.socket_path(owner)))

    def _hop_headers(self, hop: _Hop, method: str, path: str) -> dict[str, str]:
        """The headers a hop adds: a gateway's signature on a request leaving this node."""
        if not hop.signed:
            return {}
        assert self.fleet is not None and self.fleet.request_key is not None  # config.py: --peer needs the key
        return {SIGNATURE_HEADER: signature(self.fleet.request_key, self.fleet.node_id, method, path)}

    async def _forward(self, request: web.Request, hop: _Hop) -> web.StreamResponse:
        # aiohttp hands over a request body already decoded, so its Content-Encoding no longer applies.
        dropped = _HOP_BY_HOP | {"content-encoding"}
        headers = CIMultiDict((k, v) for k, v in request.headers.items() if k.lower() not in dropped)
        headers[FORWARDED_FOR] = request.remote or ""
        headers[FORWARDED_ORIGIN] = f"{request.scheme}://{request.host}"
        headers.update(self._hop_headers(hop, request.method, request.path))
        body = await request.read() if request.body_exists else None  # kept since text_body read it
        try:
            answer = await hop.client.request(
                request.method, f"{hop.base_url}{request.path_qs}", headers=headers, data=body, allow_redirects=False
            )
        except (aiohttp.ClientError, TimeoutError) as exc:
            logger.warning("%s could not reach %s for %s: %s", self._name, hop.name, request.path, exc)
            owner = hop.name.split()[0]
            unreachable = f"the {owner} that owns this session is unreachable ({exc.__class__.__name__})"
            return web.json_response({"error": unreachable}, status=502)
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

    async def relay_websocket(
        self, request: web.Request, ws: web.WebSocketResponse, first: str, session_id: str
    ) -> bool:
        """Carry a resuming WebSocket to its session's owner: the same path and query, `first` sent
        ahead, then every message both ways until one side closes, whose close code the other gets."""
        hop = self._next_hop(session_id, FORWARDED_BY_NODE in request)
        if hop is None:
            return False
        headers = {FORWARDED_FOR: request.remote or "", FORWARDED_ORIGIN: f"{request.scheme}://{request.host}"}
        headers.update({name: request.headers[name] for name in RELAYED_WS_HEADERS if name in request.headers})
        headers.update(self._hop_headers(hop, "GET", request.path))
        # A client of its own: closing it drops the connection with no closing handshake, which is how
        # the owner must learn that the client's connection was lost (it then keeps the session).
        connector = aiohttp.TCPConnector() if hop.socket_path is None else aiohttp.UnixConnector(path=hop.socket_path)
        async with aiohttp.ClientSession(connector=connector, timeout=FORWARD_TIMEOUT) as http:
            try:
                # No size limit this way: the owner bounds what it sends, and `ws` what the client sends.
                url = f"{hop.base_url}{request.path_qs}"
                owner = await http.ws_connect(
                    url, headers=headers, max_msg_size=0, timeout=RELAY_WS_TIMEOUT, heartbeat=RELAY_HEARTBEAT_S
                )
            except (aiohttp.ClientError, TimeoutError) as exc:
                logger.warning("%s could not reach %s to resume %s: %s", self._name, hop.name, session_id, exc)
                unreachable = f"the {hop.name} that owns this session is unreachable"
                await ws.send_json({"type": "error", "message": unreachable})
                await ws.close()
                return True
            await owner.send_str(first)
            if not await _pump_both_ways(ws, request.transport, owner):
                await owner.close()
        return True

    async def redeem(self, key: str) -> Grant | None:
        """The grant of `key`, redeemed by the process that minted it; None if it is not valid."""
        return await self._redeem(key, from_a_node=False)

    async def _redeem(self, key: str, from_a_node: bool) -> Grant | None:
        hop = self._next_hop(key.removeprefix(KEY_PREFIX), from_a_node)
        if hop is None:
            return self.keys.redeem(key)
        try:
            async with hop.client.post(
                f"{hop.base_url}{REDEEM_PATH}",
                data=key,
                headers=self._hop_headers(hop, "POST", REDEEM_PATH),
                timeout=REDEEM_TIMEOUT,
            ) as answer:
                if answer.status != 200:
                    return None
                body = await answer.json()
                return Grant(float(body["expires_at"]), dict(body["config"]))
        except (aiohttp.ClientError, TimeoutError, ValueError, KeyError, TypeError) as exc:
            logger.warning("%s could not redeem a key at %s: %s", self._name, hop.name, exc)
            return None

    async def give_back(self, key: str, grant: Grant) -> None:
        """Make `key` valid again where it was minted (a dead process's keys are lost anyway)."""
        await self._give_back(key, grant, from_a_node=False)

    async def _give_back(self, key: str, grant: Grant, from_a_node: bool) -> None:
        hop = self._next_hop(key.removeprefix(KEY_PREFIX), from_a_node)
        if hop is None:
            self.keys.give_back(key, grant)
            return
        body = {"key": key, "expires_at": grant.expires_at, "config": grant.config}
        try:
            async with hop.client.put(
                f"{hop.base_url}{REDEEM_PATH}",
                json=body,
                headers=self._hop_headers(hop, "PUT", REDEEM_PATH),
                timeout=REDEEM_TIMEOUT,
            ) as answer:
                answer.raise_for_status()
        except (aiohttp.ClientError, TimeoutError) as exc:
            logger.warning("%s could not give a key back to %s: %s", self._name, hop.name, exc)

    async def redeem_for_owner(self, request: web.Request) -> web.Response:
        """POST REDEEM_PATH, from a sibling or a signed gateway only: redeem a key this node minted."""
        if not _forwarded(request):
            raise web.HTTPNotFound()
        grant = await self._redeem(await request.text(), from_a_node=FORWARDED_BY_NODE in request)
        if grant is None:
            return web.json_response({"error": "unknown, used or expired"}, status=404)
        return web.json_response({"expires_at": grant.expires_at, "config": grant.config})

    async def give_back_for_owner(self, request: web.Request) -> web.Response:
        """PUT REDEEM_PATH, from a sibling or a signed gateway only: a key this node minted, whose session
        did not open."""
        if not _forwarded(request):
            raise web.HTTPNotFound()
        body = await request.json()
        grant = Grant(float(body["expires_at"]), dict(body["config"]))
        await self._give_back(str(body["key"]), grant, from_a_node=FORWARDED_BY_NODE in request)
        return web.Response(status=204)

    async def close(self, _app: web.Application | None = None) -> None:
        for client in self._clients.values():
            await client.close()
        self._clients.clear()
