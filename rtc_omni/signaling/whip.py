"""WHIP ingest (RFC 9725): OBS, FFmpeg and other publishers create understanding sessions.

`POST /whip` takes an `application/sdp` offer and answers `201 Created` with a recvonly answer,
a `Location` (the session id, and its session token as `access_token`, so that a publisher
holding no token can end it), the session's tokens (capabilities.py) and its `Resume-Token`, an
`ETag` for the ICE session and one `Link` header per configured STUN/TURN server. `PATCH` on the
Location adds trickled candidates, `DELETE` ends the session. Controls and the talker reach the
session through attached peers (`kind: "control"` on /v1/rtc/offer).

An ICE restart by PATCH is refused with 422, as the RFC allows: aiortc cannot restart ICE under a
live DTLS association (aiortc #1367; its ICE transport binds one ICE connection for good). A
publisher that changed networks re-publishes instead: `POST` a new offer to the resource URL with the
`Resume-Token` header, and the session goes on with the new peer connection (201, the same Location,
a new ETag and a rotated token).
"""

from __future__ import annotations

from aiohttp import web
from aiortc import RTCIceCandidate, RTCPeerConnection, RTCSessionDescription
from aiortc.sdp import SessionDescription, candidate_from_sdp
from multidict import CIMultiDict

from ..sessions.journal import INVALID_RESUME_TOKEN, ResumeRefused
from .capabilities import (
    GENERATION_HEADER,
    RESUME_TOKEN_HEADER,
    SESSION_TOKEN_HEADER,
    SESSION_TOKENS,
    VIEW_TOKEN_HEADER,
    checks_its_own_access,
    credential_headers,
    requires,
    resume_headers,
    with_token,
)
from .ice import configured_ice_servers, link_headers
from .keys import ENGINES, SETTINGS
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
from .peer_session import PeerSession

SDP = "application/sdp"
SDPFRAG = "application/trickle-ice-sdpfrag"
WHIP_PATH = "/whip"
CORS = {
    "Access-Control-Allow-Origin": "*",
    "Access-Control-Expose-Headers": (
        f"Location, ETag, Link, Accept-Patch, {SESSION_TOKEN_HEADER}, {VIEW_TOKEN_HEADER}, "
        f"{RESUME_TOKEN_HEADER}, {GENERATION_HEADER}"
    ),
}
PREFLIGHT = {
    **CORS,
    "Access-Control-Allow-Methods": "OPTIONS, POST, PATCH, DELETE",
    "Access-Control-Allow-Headers": f"Authorization, Content-Type, If-Match, {RESUME_TOKEN_HEADER}",
}
# Why a PATCH may not restart ICE, and what a WHIP publisher does instead.
NO_ICE_RESTART = "ICE restart is not supported: aiortc cannot restart ICE under a live DTLS association (aiortc #1367)"
REPUBLISH = f"; POST a new offer to this resource URL with its {RESUME_TOKEN_HEADER} header to re-publish"


def resource_path(session_id: str) -> str:
    return f"{WHIP_PATH}/{session_id}"


def cors_error(status: int, message: str, **headers: str) -> web.Response:
    return json_error(status, message, **CORS, **headers)


def _media_problem(offer: SessionDescription) -> str | None:
    """Why a publisher's offer does not fit one understanding session (RFC 9725: one stream)."""
    kinds = [m.kind for m in offer.media]
    if kinds.count("audio") > 1 or kinds.count("video") > 1:
        return "a WHIP offer carries at most one audio and one video track"
    if "audio" not in kinds and "video" not in kinds:
        return "a WHIP offer needs an audio or a video track"
    return None


def etag(pc: RTCPeerConnection) -> str:
    """A strong entity tag for the ICE session: the server's ICE username fragment."""
    ice = SessionDescription.parse(pc.localDescription.sdp).media[0].ice
    return f'"{ice.usernameFragment if ice else ""}"'


def preflight(resource: bool) -> web.Response:
    """CORS preflight; no ICE servers here (RFC 9725 advises against it)."""
    accept = {"Accept-Patch": SDPFRAG} if resource else {"Accept-Post": SDP}
    return web.Response(status=204, headers={**PREFLIGHT, **accept})


def created(
    request: web.Request,
    resource: tuple[str, str],
    answer: RTCSessionDescription,
    pc: RTCPeerConnection,
    name: str,
    extra_headers: dict[str, str] | None = None,
) -> web.Response:
    """The `201 Created` of WHIP and WHEP: the answer, its resource URL (`resource`: the path and
    the token that opens it), ETag and ICE servers."""
    path, token = resource
    location = with_token(request.url.with_path(path), token)
    headers = CIMultiDict(
        {**CORS, "Content-Type": SDP, "Location": location, "ETag": etag(pc), "Accept-Patch": SDPFRAG}
    )
    headers.update(extra_headers or {})
    for link in link_headers(configured_ice_servers(request.app[SETTINGS], name)):
        headers.add("Link", link)
    return web.Response(status=201, body=answer.sdp.encode(), headers=headers)


async def options(request: web.Request) -> web.Response:
    return preflight(resource="session_id" in request.match_info)


async def _publisher_offer(request: web.Request) -> str | web.Response:
    """The SDP of a publisher's offer, or the error answering it."""
    if request.content_type != SDP:
        return cors_error(415, f"Content-Type must be {SDP}")
    sdp = await request.text()
    parsed = parse_offer(request, sdp)
    if isinstance(parsed, str):
        return cors_error(400, parsed)
    problem = _media_problem(parsed)
    if problem is not None:
        return cors_error(422, problem)
    return sdp


def _published(request: web.Request, peer: PeerSession, answer: RTCSessionDescription) -> web.Response:
    """The 201 of a publish or a re-publish: the resource URL, the ETag of the new ICE session, the tokens."""
    session_token = request.app[SESSION_TOKENS].token(peer.session_id, "control")
    resource = (resource_path(peer.session_id), session_token)
    headers = {**credential_headers(request, peer.session_id), **resume_headers(peer.session_id, peer.resumable)}
    return created(request, resource, answer, peer.pc, peer.session_id, headers)


@opens_session
async def post(request: web.Request) -> web.Response:
    if "understand" not in request.app[ENGINES].kinds:
        return cors_error(503, "this server does not serve understanding sessions")
    sdp = await _publisher_offer(request)
    if isinstance(sdp, web.Response):
        return sdp
    try:
        peer, answer = await open_session(request.app, "understand", sdp, ingest_only=True)
    except OFFER_REFUSALS as exc:
        return refusal(exc, "WHIP offer", cors_error)
    return _published(request, peer, answer)


@checks_its_own_access
async def republish(request: web.Request) -> web.Response:
    """A publisher's new peer connection (another network) takes its session over: its resume token
    alone authorises it."""
    token = request.headers.get(RESUME_TOKEN_HEADER)
    if not token:
        refused = ResumeRefused(INVALID_RESUME_TOKEN, f"a re-publish needs the {RESUME_TOKEN_HEADER} header")
        return resume_refusal(refused, **CORS)
    sdp = await _publisher_offer(request)
    if isinstance(sdp, web.Response):
        return sdp
    session_id = request.match_info["session_id"]
    try:
        peer, answer = await resume_session(
            request, session_id, sdp, token, None, allow_resync=True, accepts=lambda peer: peer.ingest_only
        )
    except ResumeRefused as exc:
        return resume_refusal(exc, **CORS)
    except OFFER_REFUSALS as exc:
        return refusal(exc, "WHIP re-publish", cors_error)
    return _published(request, peer, answer)


@requires("control")
async def patch(request: web.Request) -> web.Response:
    """Trickle ICE (RFC 8840 fragments): remote candidates in, 204 out; ICE restart is refused."""
    peer = find_peer_session(request, request.match_info["session_id"])
    if peer is None:
        return cors_error(404, "no such WHIP session")
    return await trickle(request, peer.pc, REPUBLISH)


async def trickle(request: web.Request, pc: RTCPeerConnection, instead: str) -> web.Response:
    """Apply a PATCH's trickle-ice-sdpfrag to `pc` (shared by WHIP and WHEP resources); an ICE restart
    is refused, saying why and what to do `instead`."""
    if request.content_type != SDPFRAG:
        return cors_error(415, f"Content-Type must be {SDPFRAG}")
    if_match = request.headers.get("If-Match")
    if if_match == "*":
        return cors_error(422, NO_ICE_RESTART + instead)
    if if_match is not None and if_match != etag(pc):
        return cors_error(412, "If-Match does not match the ICE session's ETag")
    try:
        candidates = _parse_fragment(await request.text(), pc)
    except IceRestartRequested as exc:
        return cors_error(422, f"{NO_ICE_RESTART} ({exc}){instead}")
    except ValueError as exc:
        return cors_error(400, str(exc))
    limit = request.app[SETTINGS].max_remote_candidates
    if remote_candidate_count(pc) + len(candidates) > limit:
        return cors_error(422, f"at most {limit} remote ICE candidates per peer (--max-remote-candidates)")
    for candidate in candidates:
        await pc.addIceCandidate(candidate)
    return web.Response(status=204, headers=CORS)


def remote_candidate_count(pc: RTCPeerConnection) -> int:
    """Remote ICE candidates `pc` holds, from its offer and from earlier PATCHes."""
    transports = {t.receiver.transport.transport for t in pc.getTransceivers()}
    if pc.sctp is not None:
        transports.add(pc.sctp.transport.transport)
    return sum(len(t.getRemoteCandidates()) for t in transports)


class IceRestartRequested(Exception):
    """The fragment carries new ICE credentials; aiortc cannot restart ICE."""


def _parse_fragment(fragment: str, pc: RTCPeerConnection) -> list[RTCIceCandidate]:
    """The UDP candidates of a trickle-ice-sdpfrag; ValueError if one does not parse."""
    remote = SessionDescription.parse(pc.remoteDescription.sdp).media[0]
    remote_ufrag = remote.ice.usernameFragment if remote.ice else None
    mid = remote.rtp.muxId or "0"
    candidates = []
    for line in fragment.splitlines():
        line = line.strip()
        if line.startswith("a=ice-ufrag:") and line.split(":", 1)[1] != remote_ufrag:
            raise IceRestartRequested("the fragment has a new ice-ufrag")
        if line.startswith("a=candidate:"):
            try:
                candidate = candidate_from_sdp(line[len("a=candidate:") :])
            except (AssertionError, ValueError, IndexError) as exc:  # aiortc asserts on too few fields
                raise ValueError(f"unparsable candidate {line!r}: {exc}") from exc
            if candidate.protocol.lower() == "udp":  # aioice has no ICE-TCP; RFC 9725: drop silently
                candidate.sdpMid = mid
                candidates.append(candidate)
    return candidates


@requires("control")
async def delete(request: web.Request) -> web.Response:
    peer = find_peer_session(request, request.match_info["session_id"])
    if peer is None:
        return cors_error(404, "no such WHIP session")
    await peer.close()
    return web.Response(status=200, headers=CORS)


def add_routes(app: web.Application) -> None:
    app.router.add_route("OPTIONS", WHIP_PATH, options)
    app.router.add_post(WHIP_PATH, post)
    resource = WHIP_PATH + "/{session_id}"
    app.router.add_route("OPTIONS", resource, options)
    app.router.add_post(resource, republish)
    app.router.add_patch(resource, patch)
    app.router.add_delete(resource, delete)
