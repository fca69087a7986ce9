"""Signing in with a gpud token, and out: the session cookie's life."""

from __future__ import annotations

import secrets
import time

from aiohttp import web

from gpud.controller.auth import digest
from gpud.controller.keys import CONTROLLER
from gpud.ui.app import SIGNER, principal_of, render
from gpud.ui.session import LOGIN_COOKIE, SESSION_COOKIE, SESSION_S

LOGIN_NONCE_S = 3600


def _next(request: web.Request, value: object) -> str:
    """Where to go after signing in: a dashboard path, never another site."""
    target = value if isinstance(value, str) else ""
    return target if target.startswith("/ui/") and not target.startswith("/ui//") and "\\" not in target else "/ui/"


def _secure(request: web.Request) -> bool:
    """Whether cookies are marked Secure: served over TLS, or behind a TLS proxy as [ui] secure_cookie says."""
    return request.secure or request.app[CONTROLLER].config.ui_secure_cookie


def _login_page(request: web.Request, status: int = 200, message: str = "") -> web.Response:
    nonce = request.cookies.get(LOGIN_COOKIE) or secrets.token_urlsafe(16)
    response = render(request, "login.html", status, title="Sign in", message=message,
                      csrf=request.app[SIGNER].csrf("login:" + nonce), next=_next(request, request.query.get("next")))
    response.set_cookie(LOGIN_COOKIE, nonce, max_age=LOGIN_NONCE_S, path="/ui/login", httponly=True,
                        samesite="Strict", secure=_secure(request))
    return response


async def login_form(request: web.Request) -> web.Response:
    return _login_page(request)


async def login(request: web.Request) -> web.Response:
    """Check the token (form field ``token``); on success, a signed session cookie and a redirect."""
    form = await request.post()
    signer = request.app[SIGNER]
    nonce = request.cookies.get(LOGIN_COOKIE, "")
    given = form.get("csrf")
    if not signer.csrf_ok("login:" + nonce if nonce else "", given if isinstance(given, str) else None):
        return _login_page(request, 403, "the sign-in form had expired; try again")
    token = form.get("token")
    token = token.strip() if isinstance(token, str) else ""
    ctrl = request.app[CONTROLLER]
    value, session = signer.new_session(digest(token), time.time())
    if not token or principal_of(ctrl, session) is None:
        return _login_page(request, 401, "unknown or revoked token" if token else "paste your gpud token")
    response = web.HTTPSeeOther(location=_next(request, form.get("next")))
    response.set_cookie(SESSION_COOKIE, value, max_age=int(SESSION_S), path="/ui/", httponly=True,
                        samesite="Strict", secure=_secure(request))
    response.del_cookie(LOGIN_COOKIE, path="/ui/login")
    raise response


async def logout(request: web.Request) -> web.Response:
    """Forget the session in this browser and go back to the sign-in page."""
    response = web.HTTPSeeOther(location="/ui/login")
    response.del_cookie(SESSION_COOKIE, path="/ui/")
    raise response


def add_routes(app: web.Application) -> None:
    """Register the sign-in and sign-out pages."""
    app.router.add_get("/ui/login", login_form)
    app.router.add_post("/ui/login", login)
    app.router.add_post("/ui/logout", logout)
