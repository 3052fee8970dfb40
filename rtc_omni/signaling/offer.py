"""JSON signaling: `POST /v1/rtc/offer`, and stats / teardown of a session by id.

Handlers stay thin: parse and validate, call into the session layer, serialise.
"""

from __future__ import annotations

import logging
from typing import Any, Literal

from aiohttp import web
from aiortc import RTCSessionDescription
from aiortc.sdp import SessionDescription
from pydantic import BaseModel, ValidationError

from ..sessions.registry import SessionLimitReached, new_session_id
from .keys import ENGINES, RECORDINGS, REGISTRY, SETTINGS
from .peer import OfferRejected, PeerSession

logger = logging.getLogger(__name__)

MAX_OFFER_BYTES = 256 * 1024


class OfferRequest(BaseModel):
    sdp: str
    type: Literal["offer"]
    kind: str = "understand"


def json_error(status: int, message: str, **headers: str) -> web.Response:
    return web.json_response({"error": message}, status=status, headers=headers or None)


def _parse_sdp(sdp: str) -> str | None:
    """Why the SDP is unusable, or None if aiortc can parse it."""
    if not sdp.strip().startswith("v=0"):
        return "SDP must start with v=0"
    try:
        parsed = SessionDescription.parse(sdp)
    except Exception as exc:  # aiortc raises assorted errors on malformed SDP
        return f"unparsable SDP: {exc}"
    if not parsed.media:
        return "SDP has no media sections"
    return None


async def post_offer(request: web.Request) -> web.Response:
    settings = request.app[SETTINGS]
    registry = request.app[REGISTRY]
    if request.content_length is not None and request.content_length > MAX_OFFER_BYTES:
        return json_error(413, f"offer larger than {MAX_OFFER_BYTES} bytes")
    try:
        body: Any = await request.json()
    except ValueError:
        return json_error(400, "body must be JSON: {sdp, type: 'offer', kind}")
    try:
        offer = OfferRequest.model_validate(body)
    except ValidationError as exc:
        return json_error(400, f"invalid offer: {exc.errors(include_url=False)}")
    engines = request.app[ENGINES]
    if offer.kind not in engines.kinds:
        served = " and ".join(repr(k) for k in engines.kinds)
        return json_error(400, f"unknown session kind {offer.kind!r}; this server offers {served}")
    problem = _parse_sdp(offer.sdp)
    if problem is not None:
        return json_error(400, problem)
    try:
        registry.check_capacity()
    except SessionLimitReached as exc:
        return json_error(503, str(exc), **{"Retry-After": "5"})

    session_id = new_session_id()

    async def forget(_peer: PeerSession) -> None:
        registry.remove(session_id)

    peer = PeerSession(session_id, offer.kind, settings, engines, on_closed=forget, recordings=request.app[RECORDINGS])
    registry.add(peer)
    try:
        answer = await peer.accept(RTCSessionDescription(sdp=offer.sdp, type="offer"))
    except (OfferRejected, ValueError, RuntimeError) as exc:
        logger.info("offer rejected: %s", exc)
        await peer.close()
        return json_error(400, f"cannot answer this offer: {exc}")
    return web.json_response({"sdp": answer.sdp, "type": answer.type, "session_id": session_id})


async def get_session(request: web.Request) -> web.Response:
    session = request.app[REGISTRY].get(request.match_info["session_id"])
    if session is None:
        return json_error(404, "no such session")
    return web.json_response(await session.stats())


async def delete_session(request: web.Request) -> web.Response:
    session = request.app[REGISTRY].get(request.match_info["session_id"])
    if session is None:
        return json_error(404, "no such session")
    await session.close()
    return web.json_response({"session_id": session.session_id, "closed": True})


async def get_recording(request: web.Request) -> web.StreamResponse:
    session_id = request.match_info["session_id"]
    live = request.app[REGISTRY].get(session_id)
    recorder = getattr(getattr(live, "session", None), "recorder", None)
    if recorder is not None and not recorder.finished:
        return json_error(409, "the recording is not finished yet; fetch it after session.done")
    path = request.app[RECORDINGS].get(session_id)
    if path is None:
        return json_error(404, "no recording for this session (send record: true in session.start)")
    return web.FileResponse(path, headers={"Content-Type": "video/mp4"})


def add_routes(app: web.Application) -> None:
    app.router.add_post("/v1/rtc/offer", post_offer)
    app.router.add_get("/v1/rtc/sessions/{session_id}", get_session)
    app.router.add_delete("/v1/rtc/sessions/{session_id}", delete_session)
    app.router.add_get("/v1/rtc/sessions/{session_id}/recording", get_recording)
