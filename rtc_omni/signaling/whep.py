"""WHEP egress (draft-ietf-wish-whep): any WHEP player watches or hears a running session.

`POST /whep/<session id>` takes a player's recvonly `application/sdp` offer and answers
`201 Created` with a sendonly answer carrying the session's outgoing media (the talker of an
understanding session, the generated video of a generation session), a viewer `Location` (with
the session's view token as `access_token`), an `ETag` and `Link` ICE servers, exactly as WHIP
does. Watching needs the session's view token (or its session token); a viewer never controls the
session: a DataChannel it opens is closed. A viewer is an attached peer of the session:
viewers using the same codec share one encode (media/shared_encode.py), and at most
MAX_ATTACHED_PEERS controllers and viewers fit on one session (503 beyond). `PATCH` trickles
candidates, `DELETE` ends the viewer only.
"""

from __future__ import annotations

from aiohttp import web
from aiortc import RTCSessionDescription

from .capabilities import SESSION_TOKENS, requires
from .limits import opens_session
from .offer import OFFER_REFUSALS, find_peer_session, parse_offer, refusal
from .peer_session import AttachedPeer
from .whip import CORS, SDP, cors_error, created, preflight, trickle

WHEP_PATH = "/whep"


def viewer_path(session_id: str, resource_id: str) -> str:
    return f"{WHEP_PATH}/{session_id}/{resource_id}"


def _find_viewer(request: web.Request) -> AttachedPeer | None:
    peer = find_peer_session(request, request.match_info["session_id"])
    return None if peer is None else peer.find_attached(request.match_info["viewer_id"])


async def options(request: web.Request) -> web.Response:
    return preflight(resource="viewer_id" in request.match_info)


@opens_session
@requires("view")
async def post(request: web.Request) -> web.Response:
    peer = find_peer_session(request, request.match_info["session_id"])
    if peer is None:
        return cors_error(404, "no such session")
    if request.content_type != SDP:
        return cors_error(415, f"Content-Type must be {SDP}")
    sdp = await request.text()
    parsed = parse_offer(request, sdp)
    if isinstance(parsed, str):
        return cors_error(400, parsed)
    kind = peer.outgoing.kind
    if not peer.has_outgoing or kind not in {m.kind for m in parsed.media}:
        return cors_error(422, f"this session sends {kind if peer.has_outgoing else 'no media'}; offer to receive it")
    try:
        viewer, answer = await peer.attach(RTCSessionDescription(sdp=sdp, type="offer"), "WHEP viewer", controls=False)
    except OFFER_REFUSALS as exc:
        return refusal(exc, "WHEP offer", cors_error)
    view_token = request.app[SESSION_TOKENS].token(peer.session_id, "view")
    resource = (viewer_path(peer.session_id, viewer.resource_id), view_token)
    return created(request, resource, answer, viewer.pc, viewer.resource_id)


@requires("view")
async def patch(request: web.Request) -> web.Response:
    viewer = _find_viewer(request)
    if viewer is None:
        return cors_error(404, "no such WHEP viewer")
    return await trickle(request, viewer.pc, "; POST a new offer to the session's WHEP URL for a new viewer")


@requires("view")
async def delete(request: web.Request) -> web.Response:
    viewer = _find_viewer(request)
    if viewer is None:
        return cors_error(404, "no such WHEP viewer")
    await viewer.close()
    return web.Response(status=200, headers=CORS)


def add_routes(app: web.Application) -> None:
    session = WHEP_PATH + "/{session_id}"
    app.router.add_route("OPTIONS", session, options)
    app.router.add_post(session, post)
    viewer = session + "/{viewer_id}"
    app.router.add_route("OPTIONS", viewer, options)
    app.router.add_patch(viewer, patch)
    app.router.add_delete(viewer, delete)
