"""OpenAI's WebRTC realtime endpoint: `POST /v1/realtime/calls`, as `client.realtime.calls.create` calls it.

The offer comes as `application/sdp`, or as the SDK's multipart form (an `sdp` part and an
optional `session` JSON part); `POST /v1/realtime?model=...` with an SDP body is the older form.
The answer is `201 Created`, `application/sdp`, with `Location: /v1/realtime/calls/{call_id}`;
`DELETE` on it (or the SDK's `POST .../hangup`) hangs up. The session is a `RealtimeSession` on a
`PeerSession`: events on the `oai-events` DataChannel, speech on the audio track (the talker),
the microphone and an optional camera m-line into the session.
"""

from __future__ import annotations

import json
from typing import Any

from aiohttp import BodyPartReader, web

from ..protocol import realtime as proto
from .client_secrets import opening_config
from .keys import ENGINES
from .offer import MAX_OFFER_BYTES, OFFER_REFUSALS, find_peer_session, json_error, open_session, parse_sdp, refusal

CALLS_PATH = "/v1/realtime/calls"
SDP = "application/sdp"
MAX_SESSION_BYTES = 64 * 1024


class BadOffer(Exception):
    """The request does not hold a usable offer; its message is the 4xx body."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


def call_path(call_id: str) -> str:
    return f"{CALLS_PATH}/{call_id}"


async def _bounded_text(part: BodyPartReader, limit: int) -> str:
    data = bytearray()
    while chunk := await part.read_chunk():
        data.extend(chunk)
        if len(data) > limit:
            raise BadOffer(413, f"the {part.name} part is larger than {limit} bytes")
    return data.decode("utf-8", errors="replace")


async def _bounded_text_body(request: web.Request) -> str:
    body = await request.content.read(MAX_OFFER_BYTES + 1)
    if len(body) > MAX_OFFER_BYTES:
        raise BadOffer(413, f"offer larger than {MAX_OFFER_BYTES} bytes")
    return body.decode("utf-8", errors="replace")


async def _read_offer(request: web.Request) -> tuple[str, dict[str, Any]]:
    """The SDP offer and the session changes it came with."""
    if request.content_length is not None and request.content_length > MAX_OFFER_BYTES + MAX_SESSION_BYTES:
        raise BadOffer(413, "offer too large")
    if request.content_type == SDP:
        return await _bounded_text_body(request), {}
    if request.content_type != "multipart/form-data":
        raise BadOffer(415, f"Content-Type must be {SDP} or multipart/form-data (sdp, session)")
    sdp: str | None = None
    session: dict[str, Any] = {}
    reader = await request.multipart()
    while (part := await reader.next()) is not None:
        if not isinstance(part, BodyPartReader):
            raise BadOffer(400, "nested multipart bodies are not supported")
        if part.name == "sdp":
            sdp = await _bounded_text(part, MAX_OFFER_BYTES)
        elif part.name == "session":
            try:
                session = json.loads(await _bounded_text(part, MAX_SESSION_BYTES))
            except ValueError:
                raise BadOffer(400, "the session part must be JSON") from None
            if not isinstance(session, dict):
                raise BadOffer(400, "the session part must be a JSON object")
    if sdp is None:
        raise BadOffer(400, "the form has no sdp part")
    return sdp, session


async def create_call(request: web.Request) -> web.Response:
    """A realtime session over WebRTC; 201 with the SDP answer and the call's URL."""
    if "understand" not in request.app[ENGINES].kinds:
        return json_error(503, "this server has no conversation engine for realtime sessions")
    try:
        sdp, session = await _read_offer(request)
    except BadOffer as exc:
        return json_error(exc.status, str(exc))
    try:
        config = proto.SessionConfig().updated(opening_config(request)).updated(session).model_dump(mode="json")
    except ValueError as exc:
        return json_error(400, f"invalid session: {exc}")
    parsed = parse_sdp(sdp)
    if isinstance(parsed, str):
        return json_error(400, parsed)
    try:
        peer, answer = await open_session(request.app, "realtime", sdp, realtime_config=config)
    except OFFER_REFUSALS as exc:
        return refusal(exc, "realtime call")
    location = str(request.url.with_path(call_path(peer.session_id)).with_query(None))
    return web.Response(status=201, text=answer.sdp, content_type=SDP, headers={"Location": location})


async def hang_up(request: web.Request) -> web.Response:
    peer = find_peer_session(request, request.match_info["call_id"])
    if peer is None or peer.kind != "realtime":
        return json_error(404, "no such call")
    await peer.close()
    return web.Response(status=200)


def add_routes(app: web.Application) -> None:
    app.router.add_post(CALLS_PATH, create_call)
    app.router.add_post(proto.WEBSOCKET_PATH, create_call)  # the older form: POST /v1/realtime?model=...
    app.router.add_delete(CALLS_PATH + "/{call_id}", hang_up)
    app.router.add_post(CALLS_PATH + "/{call_id}/hangup", hang_up)
