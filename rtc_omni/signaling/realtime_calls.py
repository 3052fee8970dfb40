"""OpenAI's WebRTC realtime endpoint: `POST /v1/realtime/calls`, as `client.realtime.calls.create` calls it.

The offer comes as `application/sdp`, or as the SDK's multipart form (an `sdp` part and an
optional `session` JSON part); `POST /v1/realtime?model=...` with an SDP body is the older form.
The answer is `201 Created`, `application/sdp`, with an absolute `Location` ending in
`/v1/realtime/calls/{call_id}` (as OpenAI's, so clients read the call id from it) and the call's
tokens as headers (capabilities.py);
`DELETE` on it (or the SDK's `POST .../hangup`) hangs up, with the server token or the call's
session token. `POST .../resume` takes the call over with a new offer (a network change): its
`Resume-Token` header alone authorises it (`Last-Event-Seq`, `Allow-Resync`: as `kind: "resume"` on
/v1/rtc/offer); the answer is 200, the same Location and the rotated `Resume-Token`.
The session is a `RealtimeSession` on a
`PeerSession`: events on the `oai-events` DataChannel, speech on the audio track (the talker),
the microphone and an optional camera m-line into the session.
"""

from __future__ import annotations

from email import policy
from email.parser import BytesParser
from typing import Any

from aiohttp import web
from pydantic import ValidationError

from ..protocol import realtime_events as proto
from ..protocol.codec import load_json
from ..protocol.validation import describe_validation_error
from ..sessions.journal import INVALID_RESUME_TOKEN, ResumeRefused
from .capabilities import (
    ALLOW_RESYNC_HEADER,
    LAST_EVENT_SEQ_HEADER,
    RESUME_TOKEN_HEADER,
    checks_its_own_access,
    credential_headers,
    requires,
    resume_headers,
)
from .client_secrets import opening_config, spend_key
from .keys import ENGINES
from .limits import opens_session
from .offer import (
    OFFER_REFUSALS,
    find_peer_session,
    json_error,
    open_session,
    parse_offer,
    refusal,
    resume_refusal,
    resume_session,
)

CALLS_PATH = "/v1/realtime/calls"
SDP = "application/sdp"


class BadOffer(Exception):
    """The request does not hold a usable offer; its message is the 4xx body."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


def call_path(call_id: str) -> str:
    return f"{CALLS_PATH}/{call_id}"


def _form_fields(content_type: str, body: bytes) -> dict[str, str]:
    """The text fields of a multipart/form-data body, by name (the body is already bounded and read)."""
    message = BytesParser(policy=policy.HTTP).parsebytes(f"Content-Type: {content_type}\r\n\r\n".encode() + body)
    if not message.is_multipart():
        raise BadOffer(400, "the multipart body has no parts (is its boundary right?)")
    fields = {}
    for part in message.iter_parts():
        name = part.get_param("name", header="content-disposition")
        payload = part.get_payload(decode=True)
        if isinstance(name, str) and isinstance(payload, bytes):
            fields[name] = payload.decode("utf-8", errors="replace")
    return fields


async def _read_offer(request: web.Request) -> tuple[str, dict[str, Any]]:
    """The SDP offer and the session changes it came with (the body is read and bounded by the
    app's limits before any handler runs: limits.text_body)."""
    if request.content_type == SDP:
        return await request.text(), {}
    if request.content_type != "multipart/form-data":
        raise BadOffer(415, f"Content-Type must be {SDP} or multipart/form-data (sdp, session)")
    fields = _form_fields(request.headers.get("Content-Type", ""), await request.read())
    if "sdp" not in fields:
        raise BadOffer(400, "the form has no sdp part")
    try:
        session = load_json(fields.get("session", "{}"))
    except ValueError as exc:
        raise BadOffer(400, f"the session part must be JSON ({exc})") from None
    if not isinstance(session, dict):
        raise BadOffer(400, "the session part must be a JSON object")
    return fields["sdp"], session


@opens_session
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
    except ValidationError as exc:
        return json_error(400, f"invalid session: {describe_validation_error(exc)}")
    parsed = parse_offer(request, sdp)
    if isinstance(parsed, str):
        return json_error(400, parsed)
    try:
        peer, answer = await open_session(request.app, "realtime", sdp, realtime_config=config)
    except OFFER_REFUSALS as exc:
        return refusal(exc, "realtime call")
    spend_key(request)
    headers = {
        "Location": _location(request, peer.session_id),
        **credential_headers(request, peer.session_id),
        **resume_headers(peer.session_id, peer.resumable),
    }
    return web.Response(status=201, text=answer.sdp, content_type=SDP, headers=headers)


def _location(request: web.Request, call_id: str) -> str:
    return str(request.url.with_path(call_path(call_id)).with_query(None))


@checks_its_own_access
async def resume_call(request: web.Request) -> web.Response:
    """A new peer connection takes the call over; 200 with the answer, the call's URL and the rotated token."""
    call_id = request.match_info["call_id"]
    if request.content_type != SDP:
        return json_error(415, f"Content-Type must be {SDP}")
    token = request.headers.get(RESUME_TOKEN_HEADER)
    if not token:
        return resume_refusal(ResumeRefused(INVALID_RESUME_TOKEN, f"a resume needs the {RESUME_TOKEN_HEADER} header"))
    try:
        last_seq = int(request.headers.get(LAST_EVENT_SEQ_HEADER, "0"))
    except ValueError:
        last_seq = -1
    if last_seq < 0:
        return json_error(400, f"{LAST_EVENT_SEQ_HEADER} must be the last server_event_seq received (0: none)")
    allow_resync = request.headers.get(ALLOW_RESYNC_HEADER, "").lower() in ("1", "true")
    sdp = await request.text()
    parsed = parse_offer(request, sdp)
    if isinstance(parsed, str):
        return json_error(400, parsed)
    try:
        peer, answer = await resume_session(
            request, call_id, sdp, token, last_seq, allow_resync, accepts=lambda peer: peer.kind == "realtime"
        )
    except ResumeRefused as exc:
        return resume_refusal(exc)
    except OFFER_REFUSALS as exc:
        return refusal(exc, "realtime call resume")
    headers = {"Location": _location(request, call_id), **resume_headers(call_id, peer.resumable)}
    return web.Response(status=200, text=answer.sdp, content_type=SDP, headers=headers)


@requires("control")
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
    app.router.add_post(CALLS_PATH + "/{call_id}/resume", resume_call)
