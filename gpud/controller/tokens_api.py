"""Token administration for admins: list the tokens in use and revoke them (docs/api.md)."""

from __future__ import annotations

import time

from aiohttp import web

from gpud.controller.api import ApiError, read_json, require_admin
from gpud.controller.auth import TOKEN_ID_CHARS, token_id
from gpud.controller.keys import CONTROLLER, PRINCIPAL
from gpud.store.base import TokenRecord

MIN_ID_CHARS = 6  # a shorter prefix would too easily name the wrong token


def token_view(record: TokenRecord) -> dict:
    """The API's token object: its id (the start of its hash), whose it is and what it may do; never the token."""
    return {"id": token_id(record.hash), "user": record.user, "admin": record.admin,
            "allow_root": record.allow_root, "created": record.created}


async def list_tokens(request: web.Request) -> web.Response:
    """Every token that is accepted now, oldest first."""
    require_admin(request[PRINCIPAL])
    ctrl = request.app[CONTROLLER]
    return web.json_response({"tokens": [token_view(t) for t in ctrl.auth.active()]})


async def revoke_tokens(request: web.Request) -> web.Response:
    """Revoke one token by id, or every token of a user; the last admin token stays."""
    require_admin(request[PRINCIPAL])
    ctrl = request.app[CONTROLLER]
    body = await read_json(request)
    if not isinstance(body, dict) or len(body) != 1 or not isinstance(next(iter(body.values())), str) \
            or next(iter(body)) not in ("id", "user"):
        raise ApiError(422, 'say which tokens: {"id": "<id from gpuctl token list>"} or {"user": "alice"}')
    if "id" in body:
        prefix = body["id"].strip().lower()
        if not MIN_ID_CHARS <= len(prefix) <= 64 or any(c not in "0123456789abcdef" for c in prefix):
            raise ApiError(422, f"a token id is {MIN_ID_CHARS} or more hex digits (gpuctl token list shows "
                                f"{TOKEN_ID_CHARS})", field="id")
        chosen = ctrl.auth.matching(prefix)
        if len(chosen) > 1:
            raise ApiError(409, f"{len(chosen)} tokens have ids starting {prefix}; give more of the id", field="id")
        if not chosen:
            raise ApiError(404, f"no token in use has id {prefix}", field="id")
    else:
        chosen = [t for t in ctrl.auth.active() if t.user == body["user"]]
        if not chosen:
            raise ApiError(404, f"user {body['user']!r} has no token in use", field="user")
    admins_left = [t for t in ctrl.auth.active() if t.admin and t not in chosen]
    if any(t.admin for t in chosen) and not admins_left:
        raise ApiError(409, "that would revoke the last admin token; create another admin token first "
                          "(gpuctl token create --user NAME --admin)")
    now = time.time()
    for record in chosen:
        ctrl.persist.token(TokenRecord(record.hash, record.user, record.admin, record.created,
                                       record.allow_root, revoked=now))
    await ctrl.commit()
    for record in chosen:
        ctrl.auth.revoke(record, now)
    return web.json_response({"revoked": [token_view(t) for t in chosen]})


def add_routes(app: web.Application) -> None:
    """Register the token administration endpoints."""
    app.router.add_get("/api/v1/tokens", list_tokens)
    app.router.add_post("/api/v1/tokens/revoke", revoke_tokens)
