"""JSON signaling: `POST /v1/rtc/offer`, and stats / teardown of a session by id.

Handlers stay thin: parse and validate, call into the session layer, serialise. `open_session`,
`parse_offer` (every offer's SDP, within --max-remote-candidates) and `refusal` (the one mapping
of an unanswerable offer to an HTTP error) are shared with the WHIP, WHEP and realtime call
endpoints, and so are `resume_session` and `resume_refusal` (a new peer connection taking a session
over with its resume token: `kind: "resume"` here, a call's `/resume`, a WHIP re-publish).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any, Literal

from aiohttp import web
from aiortc import RTCSessionDescription
from aiortc.sdp import SessionDescription
from pydantic import BaseModel, Field, ValidationError

from ..logs import SESSION_ID
from ..protocol.codec import load_json
from ..protocol.generate_messages import RECORDING_PATH
from ..protocol.validation import describe_validation_error, quoted
from ..sessions.journal import RESUME_EXPIRED, UNSUPPORTED_RESUME, ResumeRefused
from ..sessions.registry import SessionLimitReached
from .capabilities import access_refusal, checks_its_own_access, requires, session_credentials
from .factory import Services
from .keys import ENGINES, RECORDINGS, REGISTRY, SETTINGS
from .limits import opens_session
from .peer_session import OFFER_FAILURES, PeerSession, closed_on_failure

logger = logging.getLogger(__name__)

MAX_OFFER_BYTES = 256 * 1024
RETRY_AFTER_S = "5"
CONTROL_KIND = "control"
RESUME_KIND = "resume"
OFFER_REFUSALS = (SessionLimitReached, *OFFER_FAILURES)  # what `refusal` maps to an HTTP error


class OfferRequest(BaseModel):
    sdp: str
    type: Literal["offer"]
    kind: str = "understand"
    session_id: str | None = None  # the session a "control" peer attaches to, or a "resume" takes over
    resume_token: str | None = None  # kind "resume": the session's, from its answer or session.resumed
    last_received_server_event_seq: int = Field(0, ge=0)  # kind "resume": the last event the client has
    allow_resync: bool = False  # kind "resume": go on even when missed events are no longer kept


def json_error(status: int, message: str, **headers: str) -> web.Response:
    return web.json_response({"error": message}, status=status, headers=headers or None)


def parse_offer(request: web.Request, sdp: str) -> SessionDescription | str:
    """An offer's parsed SDP, or why it is unusable; every endpoint taking an offer reads it here, so
    none misses --max-remote-candidates (aioice's cost per remote candidate grows with their number)."""
    max_candidates = request.app[SETTINGS].max_remote_candidates
    if not sdp.strip().startswith("v=0"):
        return "SDP must start with v=0"
    try:
        parsed = SessionDescription.parse(sdp)
    except Exception as exc:  # aiortc raises assorted errors on malformed SDP
        return f"unparsable SDP: {exc}"
    if not parsed.media:
        return "SDP has no media sections"
    candidates = sum(len(m.ice_candidates) for m in parsed.media)
    if candidates > max_candidates:
        return f"{candidates} ICE candidates; at most {max_candidates} per peer (--max-remote-candidates)"
    for index, media in enumerate(parsed.media):
        if media.dtls is None:  # aiortc would fail on it deep inside createAnswer
            return f"media section {index} ({media.kind}) has no a=setup and a=fingerprint: DTLS is required"
        if media.rtp.muxId == "":
            return f"media section {index} ({media.kind}) has an empty a=mid"
    return parsed


def refusal(exc: Exception, what: str, error: Callable[..., web.Response] = json_error) -> web.Response:
    """The HTTP answer to an offer that was not answered (one of OFFER_REFUSALS): 503 + Retry-After
    at a session or peer limit, else 400 through `error` (WHIP and WHEP add their CORS headers)."""
    if isinstance(exc, SessionLimitReached):
        return json_error(503, str(exc), **{"Retry-After": RETRY_AFTER_S})
    logger.info("%s rejected: %s", what, exc)
    return error(400, f"cannot answer this offer: {exc}")


async def open_session(
    app: web.Application,
    kind: str,
    sdp: str,
    ingest_only: bool = False,
    realtime_config: dict[str, Any] | None = None,
) -> tuple[PeerSession, RTCSessionDescription]:
    """Create a registered session from an offer and answer it.

    Raises one of OFFER_REFUSALS: SessionLimitReached at --max-sessions, or an offer failure (the
    session is then already closed and forgotten).
    """
    registry = app[REGISTRY]
    registry.check_capacity()
    session_id = registry.new_session_id()
    SESSION_ID.set(session_id)  # this task's logs, and those of the tasks it starts, name the session

    async def forget(_peer: PeerSession) -> None:
        registry.remove(session_id)

    peer = PeerSession(
        session_id, kind, Services.of(app), on_closed=forget, ingest_only=ingest_only, realtime_config=realtime_config
    )
    try:
        registry.add(peer)  # with --workers, another worker may have taken the last place meanwhile
    except SessionLimitReached:
        await peer.close()
        raise
    async with closed_on_failure(peer):
        answer = await peer.accept(RTCSessionDescription(sdp=sdp, type="offer"))
    return peer, answer


def find_peer_session(request: web.Request, session_id: str) -> PeerSession | None:
    session = request.app[REGISTRY].get(session_id)
    return session if isinstance(session, PeerSession) else None


async def resume_session(
    request: web.Request,
    session_id: str,
    sdp: str,
    token: str,
    last_seq: int | None,
    allow_resync: bool,
    accepts: Callable[[PeerSession], bool] = lambda _peer: True,
) -> tuple[PeerSession, RTCSessionDescription]:
    """Take the WebRTC session `session_id` over with the offer `sdp` (PeerSession.resume); the resume
    token alone authorises it, and it adds no session (a draining server resumes too). `accepts`: the
    kind of session this endpoint resumes. Raises ResumeRefused, or one of OFFER_FAILURES."""
    session = request.app[REGISTRY].get(session_id)
    if session is None:
        raise ResumeRefused(RESUME_EXPIRED, f"unknown or expired session: {session_id}")
    if not isinstance(session, PeerSession) or not accepts(session):
        raise ResumeRefused(UNSUPPORTED_RESUME, "this session is not one this endpoint resumes")
    if session.resumable is None:
        raise ResumeRefused(UNSUPPORTED_RESUME, "this server keeps no session for a resume (--resume-grace 0)")
    SESSION_ID.set(session_id)
    answer = await session.resume(RTCSessionDescription(sdp=sdp, type="offer"), token, last_seq, allow_resync)
    return session, answer


def resume_refusal(exc: ResumeRefused, **headers: str) -> web.Response:
    """A refused resume: its HTTP status, and vLLM-Omni's code for it beside the reason."""
    logger.info("resume refused: %s (%s)", exc, exc.code)
    return web.json_response({"error": str(exc), "code": exc.code}, status=exc.status, headers=headers or None)


def resume_credentials(peer: PeerSession) -> dict[str, Any]:
    """The JSON fields that let a client resume the session (none without resume)."""
    if peer.resumable is None:
        return {}
    return {
        "resume_token": peer.resumable.token,
        "attachment_generation": peer.resumable.generation,
        "resume_grace_s": peer.settings.resume_grace,
    }


@opens_session
@checks_its_own_access
async def post_offer(request: web.Request) -> web.Response:
    """A new session (the server token, if there is one), `kind: "control"` on a running one (its
    session token), or `kind: "resume"` of one (its resume token)."""
    if request.content_length is not None and request.content_length > MAX_OFFER_BYTES:
        return json_error(413, f"offer larger than {MAX_OFFER_BYTES} bytes")
    if request.content_type != "application/json":
        return json_error(415, "Content-Type must be application/json")
    try:
        body: Any = load_json(await request.text())
    except ValueError as exc:
        return json_error(400, f"body must be JSON: {{sdp, type: 'offer', kind}} ({exc})")
    try:
        offer = OfferRequest.model_validate(body)
    except ValidationError as exc:
        return json_error(400, f"invalid offer: {describe_validation_error(exc)}")
    attaching = offer.kind == CONTROL_KIND
    if offer.kind != RESUME_KIND:  # a resume token is checked by the session it resumes
        refused = access_refusal(request, "control" if attaching else None, offer.session_id if attaching else None)
        if refused is not None:
            return refused
    engines = request.app[ENGINES]
    if offer.kind not in (*engines.kinds, CONTROL_KIND, RESUME_KIND):
        served = " and ".join(repr(k) for k in (*engines.kinds, CONTROL_KIND, RESUME_KIND))
        return json_error(400, f"unknown session kind {quoted(offer.kind)}; this server offers {served}")
    parsed = parse_offer(request, offer.sdp)
    if isinstance(parsed, str):
        return json_error(400, parsed)
    if attaching:
        return await _attach_controller(request, offer)
    if offer.kind == RESUME_KIND:
        return await _resume(request, offer)
    try:
        peer, answer = await open_session(request.app, offer.kind, offer.sdp)
    except OFFER_REFUSALS as exc:
        return refusal(exc, "offer")
    return web.json_response(
        {
            "sdp": answer.sdp,
            "type": answer.type,
            "session_id": peer.session_id,
            **session_credentials(request, peer.session_id),
            **resume_credentials(peer),
        }
    )


async def _resume(request: web.Request, offer: OfferRequest) -> web.Response:
    """kind "resume": a new peer connection takes the session over (peer_session.py)."""
    if offer.session_id is None or offer.resume_token is None:
        return json_error(400, 'kind "resume" needs the session_id and the resume_token of the session')
    try:
        peer, answer = await resume_session(
            request,
            offer.session_id,
            offer.sdp,
            offer.resume_token,
            offer.last_received_server_event_seq,
            offer.allow_resync,
        )
    except ResumeRefused as exc:
        return resume_refusal(exc)
    except OFFER_REFUSALS as exc:
        return refusal(exc, "resume offer")
    body = {"sdp": answer.sdp, "type": answer.type, "session_id": peer.session_id, **resume_credentials(peer)}
    return web.json_response(body)


async def _attach_controller(request: web.Request, offer: OfferRequest) -> web.Response:
    """kind "control": a DataChannel on a running session, plus its outgoing media if offered."""
    if offer.session_id is None:
        return json_error(400, 'kind "control" needs the session_id of a running session')
    peer = find_peer_session(request, offer.session_id)
    if peer is None:
        return json_error(404, "no such session")
    try:
        _controller, answer = await peer.attach(RTCSessionDescription(sdp=offer.sdp, type="offer"), "controller")
    except OFFER_REFUSALS as exc:
        return refusal(exc, "controller offer")
    return web.json_response({"sdp": answer.sdp, "type": answer.type, "session_id": peer.session_id})


@requires("view")
async def get_session(request: web.Request) -> web.Response:
    session = request.app[REGISTRY].get(request.match_info["session_id"])
    if session is None:
        return json_error(404, "no such session")
    return web.json_response(await session.stats())


@requires("control")
async def delete_session(request: web.Request) -> web.Response:
    session = request.app[REGISTRY].get(request.match_info["session_id"])
    if session is None:
        return json_error(404, "no such session")
    await session.close()
    return web.json_response({"session_id": session.session_id, "closed": True})


@requires("view")
async def get_recording(request: web.Request) -> web.StreamResponse:
    session_id = request.match_info["session_id"]
    if request.app[RECORDINGS].in_progress(session_id):
        return json_error(409, "the recording is not finished yet; fetch it after session.done")
    path = request.app[RECORDINGS].get(session_id)
    if path is None:
        return json_error(404, "no recording for this session (send record: true in session.start)")
    return web.FileResponse(path, headers={"Content-Type": "video/mp4"})


def add_routes(app: web.Application) -> None:
    app.router.add_post("/v1/rtc/offer", post_offer)
    app.router.add_get("/v1/rtc/sessions/{session_id}", get_session)
    app.router.add_delete("/v1/rtc/sessions/{session_id}", delete_session)
    app.router.add_get(RECORDING_PATH, get_recording)
