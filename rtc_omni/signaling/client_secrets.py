"""Ephemeral keys for realtime sessions: `POST /v1/realtime/client_secrets`, as OpenAI mints them.

A browser never holds the server token: the app's backend mints a key with it, and the browser
opens one realtime session (the WebSocket or a WebRTC call) with the key as its Bearer token. A key
opens one session only, until it expires (10 s to 2 h after it was minted, 600 s by default); its
`session` is that session's starting config. At most MAX_KEYS are outstanding at once. A request
that did not open its session (refused at --max-sessions, a bad offer) leaves its key unused.
"""

from __future__ import annotations

import secrets
import time
from dataclasses import dataclass
from typing import Any, Literal, Protocol

from aiohttp import web
from aiohttp.typedefs import Handler, Middleware
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from ..drain import DRAINING
from ..protocol import realtime_events as proto
from ..protocol.codec import load_json
from ..protocol.validation import describe_validation_error
from .auth import GRANT, KEY_SPENT, bearer_credentials
from .keys import DRAIN
from .offer import RETRY_AFTER_S, json_error

CLIENT_SECRETS_PATH = "/v1/realtime/client_secrets"
SESSION_PATHS = frozenset({proto.WEBSOCKET_PATH, "/v1/realtime/calls"})  # where a key opens a session
KEY_PREFIX = "ek_"
MAX_KEYS = 1024


class ExpiresAfter(BaseModel):
    model_config = ConfigDict(extra="forbid")

    anchor: Literal["created_at"] = "created_at"
    seconds: int = Field(600, ge=10, le=7200)


class SecretRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    expires_after: ExpiresAfter = Field(default_factory=ExpiresAfter)
    session: dict[str, Any] = Field(default_factory=dict)


@dataclass(frozen=True)
class Grant:
    expires_at: float  # Unix time
    config: dict[str, Any]


class EphemeralKeys:
    """The outstanding keys; a key is forgotten when redeemed or expired."""

    def __init__(self, max_keys: int = MAX_KEYS, owner_prefix: str = "") -> None:
        self.max_keys = max_keys
        self.owner_prefix = owner_prefix  # with --workers, the minting worker's (workers/identity.py)
        self._grants: dict[str, Grant] = {}

    def mint(self, seconds: int, config: dict[str, Any]) -> tuple[str, Grant] | None:
        """A new key and what it grants; None when MAX_KEYS are outstanding."""
        now = time.time()
        self._grants = {key: grant for key, grant in self._grants.items() if grant.expires_at > now}
        if len(self._grants) >= self.max_keys:
            return None
        key = KEY_PREFIX + self.owner_prefix + secrets.token_urlsafe(24)
        grant = self._grants[key] = Grant(now + seconds, config)
        return key, grant

    def redeem(self, key: str) -> Grant | None:
        """The key's grant, once; None for an unknown, used or expired key."""
        grant = self._grants.pop(key, None)
        return grant if grant is not None and grant.expires_at > time.time() else None

    def give_back(self, key: str, grant: Grant) -> None:
        """Make a redeemed key valid again: the session it was redeemed for did not open."""
        self._grants[key] = grant


EPHEMERAL_KEYS = web.AppKey("ephemeral_keys", EphemeralKeys)


async def create_client_secret(request: web.Request) -> web.Response:
    if request.app[DRAIN].draining:  # only this process redeems the key, and it is about to exit
        return json_error(503, DRAINING, **{"Retry-After": RETRY_AFTER_S})
    try:
        body = SecretRequest.model_validate(load_json(await request.text()) if request.body_exists else {})
        config = proto.SessionConfig().updated(body.session)
    except ValueError as exc:  # bad JSON or a ValidationError
        detail = describe_validation_error(exc) if isinstance(exc, ValidationError) else f"not JSON ({exc})"
        return json_error(400, f"invalid client secret request: {detail}")
    minted = request.app[EPHEMERAL_KEYS].mint(body.expires_after.seconds, config.model_dump(mode="json"))
    if minted is None:
        return json_error(503, f"{MAX_KEYS} ephemeral keys are outstanding; try again later", **{"Retry-After": "5"})
    key, grant = minted
    return web.json_response(
        {"value": key, "expires_at": int(grant.expires_at), "session": {"object": "realtime.session", **grant.config}}
    )


class KeyOwners(Protocol):
    """Where a key is redeemed, and given back: this process's keys (`OwnKeys`), or with --workers
    the worker that minted it (workers/forwarding.py)."""

    async def redeem(self, key: str) -> Grant | None: ...

    async def give_back(self, key: str, grant: Grant) -> None: ...


class OwnKeys:
    """A lone server's keys, all minted by this process."""

    def __init__(self, keys: EphemeralKeys) -> None:
        self.keys = keys

    async def redeem(self, key: str) -> Grant | None:
        return self.keys.redeem(key)

    async def give_back(self, key: str, grant: Grant) -> None:
        self.keys.give_back(key, grant)


def ephemeral_auth(owners: KeyOwners) -> Middleware:
    """Redeem a `Bearer ek_...` key on the paths that open a realtime session (401 if it is not
    valid); the request then needs no server token, and `opening_config` holds the key's session.
    The key is given back unless the handler opened the session (`spend_key`)."""

    @web.middleware
    async def redeem_key(request: web.Request, handler: Handler) -> web.StreamResponse:
        given = bearer_credentials(request.headers.get("Authorization", "")) or ""
        if request.path not in SESSION_PATHS or not given.startswith(KEY_PREFIX):
            return await handler(request)
        grant = await owners.redeem(given)
        if grant is None:
            return json_error(401, "the ephemeral key is unknown, used or expired")
        request[GRANT] = grant.config
        try:
            return await handler(request)
        finally:
            if not request.get(KEY_SPENT, False):
                await owners.give_back(given, grant)

    return redeem_key


def spend_key(request: web.Request) -> None:
    """The request opened its realtime session: the ephemeral key it came with, if any, is used up."""
    request[KEY_SPENT] = True


def opening_config(request: web.Request) -> dict[str, Any]:
    """A realtime session's config from its opening request: a redeemed key's session, and the
    `model` query parameter."""
    config = dict(request.get(GRANT, {}))
    model = request.query.get("model")
    if model is not None:
        config["model"] = model
    return config


def add_routes(app: web.Application, keys: EphemeralKeys) -> None:
    app[EPHEMERAL_KEYS] = keys
    app.router.add_post(CLIENT_SECRETS_PATH, create_client_secret)
