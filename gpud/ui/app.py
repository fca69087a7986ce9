"""The dashboard's aiohttp application: sessions, CSRF, security headers, templates and routes."""

from __future__ import annotations

import asyncio
import json
import os
import time
from typing import Any, AsyncIterator

import jinja2
from aiohttp import web
from yarl import URL

from gpud.controller.api import ApiError
from gpud.controller.auth import Principal
from gpud.controller.keys import CONTROLLER, PRINCIPAL
from gpud.controller.service import Controller
from gpud.ui.live import Live
from gpud.ui.session import SESSION_COOKIE, Session, Signer

HERE = os.path.dirname(os.path.abspath(__file__))
SIGNER: web.AppKey[Signer] = web.AppKey("ui_signer")
TEMPLATES: web.AppKey[jinja2.Environment] = web.AppKey("ui_templates")
LIVE: web.AppKey[Live] = web.AppKey("ui_live")
SESSION: web.RequestKey[Session] = web.RequestKey("gpud_ui_session")
OPEN_PREFIXES = ("/ui/login", "/ui/static/")
OPEN_PATHS = frozenset({"/", "/ui"})   # they only point at /ui/
# Scripts and styles only from the dashboard itself, no inline code, no framing by any page.
CSP = ("default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; connect-src 'self'; "
       "form-action 'self'; base-uri 'none'; frame-ancestors 'none'")


def templates() -> jinja2.Environment:
    """The page templates, every value HTML-escaped unless a template says otherwise."""
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(os.path.join(HERE, "templates")),
                             autoescape=True, trim_blocks=True, lstrip_blocks=True,
                             undefined=jinja2.StrictUndefined)
    from gpud.ui import formats
    env.filters.update(formats.FILTERS)
    return env


def render(request: web.Request, name: str, status: int = 200, **values: Any) -> web.Response:
    """The template ``name`` rendered for this request's user, with its CSRF token and the user at hand."""
    session: Session | None = request.get(SESSION)
    principal: Principal | None = request.get(PRINCIPAL)
    csrf = request.app[SIGNER].csrf(session.nonce) if session else values.pop("csrf", "")
    text = render_text(request.app, name, csrf, principal, request.path, view=request.path_qs, **values)
    return web.Response(text=text, status=status, content_type="text/html", charset="utf-8")


def render_text(app: web.Application, name: str, csrf: str, me: Principal | None, path: str, **values: Any) -> str:
    """The template ``name`` rendered for the user ``me`` on the page at ``path``, its forms carrying ``csrf``."""
    return app[TEMPLATES].get_template(name).render(csrf=csrf, me=me, path=path, **values)


def principal_of(ctrl: Controller, session: Session) -> Principal | None:
    """The user a session is for, while its token is known and not revoked."""
    record = ctrl.auth.tokens.get(session.token_hash)
    if record is None or record.revoked is not None:
        return None
    return Principal(record.user, record.admin, allow_root=record.allow_root)


def to_login(request: web.Request) -> web.Response:
    """Send a visitor without a session to the sign-in page (htmx requests are told to go there)."""
    if request.headers.get("HX-Request"):
        return web.Response(status=401, headers={"HX-Redirect": "/ui/login"})
    target = request.path_qs if request.method == "GET" and request.path != "/ui/logout" else "/ui/"
    raise web.HTTPSeeOther(location=str(URL("/ui/login").with_query(next=target)))


@web.middleware
async def guard(request: web.Request, handler: Any) -> web.StreamResponse:
    """Require a live session (but on the sign-in page and static files), a CSRF token on every POST,
    and answer the reused API's refusals as a page."""
    ctrl = request.app[CONTROLLER]
    if ctrl.role != "leader" and not request.path.startswith("/ui/static/"):
        where = f"the leader is at {ctrl.leader_url}" if ctrl.leader_url else "no controller leads right now"
        return render(request, "error.html", 503, title="Standby",
                      message=f"this controller is a standby and its dashboard shows nothing; {where}, whose "
                              f"dashboard is the cluster's")
    if not request.path.startswith(OPEN_PREFIXES) and request.path not in OPEN_PATHS:
        session = request.app[SIGNER].session(request.cookies.get(SESSION_COOKIE), time.time())
        principal = principal_of(request.app[CONTROLLER], session) if session else None
        if session is None or principal is None:
            return to_login(request)
        request[SESSION], request[PRINCIPAL] = session, principal
        if request.method == "POST":
            form = await request.post()
            given = form.get("csrf") or request.headers.get("X-CSRF-Token")
            if not request.app[SIGNER].csrf_ok(session.nonce, given if isinstance(given, str) else None):
                return render(request, "error.html", 403, title="Refused",
                              message="the form's CSRF token is missing or wrong; reload the page and try again")
    try:
        return await handler(request)
    except ApiError as exc:
        message = json.loads(exc.text or "{}").get("error", exc.reason) if exc.text else exc.reason
        return render(request, "error.html", exc.status, title=f"Error {exc.status}", message=message)


@web.middleware
async def headers(request: web.Request, handler: Any) -> web.StreamResponse:
    """Security headers on every answer: the CSP, no framing, no sniffing, no referrer; pages are not cached."""
    try:
        response = await handler(request)
    except web.HTTPException as exc:
        response = exc
        _secure(request, response)
        raise
    _secure(request, response)
    return response


def _secure(request: web.Request, response: web.StreamResponse) -> None:
    if response.prepared:  # a stream (server-sent events) set its headers before it started
        return
    response.headers["Content-Security-Policy"] = CSP
    response.headers["X-Frame-Options"] = "DENY"
    response.headers["X-Content-Type-Options"] = "nosniff"
    response.headers["Referrer-Policy"] = "no-referrer"
    if not request.path.startswith("/ui/static/"):
        response.headers["Cache-Control"] = "no-store"


async def root(request: web.Request) -> web.Response:
    raise web.HTTPFound("/ui/")


async def _watching(app: web.Application) -> AsyncIterator[None]:
    watcher = asyncio.create_task(app[LIVE].watch(app), name="gpud-ui-watch")
    yield
    app[LIVE].close()
    await watcher


async def _end_streams(app: web.Application) -> None:
    app[LIVE].close()


def make_ui_app(ctrl: Controller, signer: Signer | None = None) -> web.Application:
    """The dashboard application over the controller ``ctrl`` (its key in the controller's state directory)."""
    from gpud.ui import pages, login, live

    app = web.Application(middlewares=[headers, guard], client_max_size=1024 * 1024)
    app[CONTROLLER] = ctrl
    app[SIGNER] = signer or Signer.from_state_dir(ctrl.config.state_dir)
    app[TEMPLATES] = templates()
    app[LIVE] = Live(ctrl)
    app.on_shutdown.append(_end_streams)
    app.cleanup_ctx.append(_watching)
    app.router.add_get("/", root)
    app.router.add_get("/ui", root)
    login.add_routes(app)
    pages.add_routes(app)
    live.add_routes(app)
    app.router.add_static("/ui/static/", os.path.join(HERE, "static"), append_version=False)
    return app
