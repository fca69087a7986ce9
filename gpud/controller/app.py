"""The controller's aiohttp application: the app factory, authentication, health and metrics."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from typing import AsyncIterator, Callable

from aiohttp import web

from gpud import __version__
from gpud.controller import api, checkpoints_api, interactive, metrics_view, openapi, tokens_api, usage_api
from gpud.controller.checkpoints_api import checkpoint_principal
from gpud.controller.config import ControllerConfig
from gpud.controller.keys import CONTROLLER, PRINCIPAL
from gpud.controller.leadership import Leadership
from gpud.controller.node_link import node_connect
from gpud.controller.persist import StoreError, is_store_failure
from gpud.controller.auth import Principal
from gpud.controller.service import Controller
from gpud.controller.state_view import live_state
from gpud.ui import server as ui_server

log = logging.getLogger("gpud.controller")
OPEN_PATHS = frozenset({"/healthz", "/metrics", openapi.PATH})
NODE_PATH = "/api/v1/node/connect"


STANDBY_PATHS = frozenset({"/healthz", "/metrics"})  # what a standby answers itself
LEADER_HEADER = "X-Gpud-Leader"


def not_leader(ctrl) -> web.Response:
    """503 from a standby: the leader's URL in the body and in the X-Gpud-Leader header, when one leads."""
    leader = ctrl.leader_url
    where = f"the leader is at {leader}" if leader else "no controller leads right now; try again in a moment"
    refused = web.Response(text=json.dumps({"error": f"this controller is a standby; {where}", "leader": leader,
                                            "role": ctrl.role}),
                           status=503, content_type="application/json")
    refused.headers["Retry-After"] = "1"
    if leader:
        refused.headers[LEADER_HEADER] = leader
    return refused


def error(status: int, message: str) -> web.Response:
    """A JSON error answer."""
    return web.Response(text=json.dumps({"error": message}), status=status, content_type="application/json")


@web.middleware
async def guard(request: web.Request, handler) -> web.StreamResponse:
    """Authenticate, time the request, and turn anything unexpected into a JSON 500 (logged, never leaked)."""
    began = time.perf_counter()
    route = request.match_info.route.resource.canonical if request.match_info.route.resource else "unknown"
    ctrl = request.app[CONTROLLER]
    try:
        if ctrl.role != "leader" and request.path not in STANDBY_PATHS:
            return not_leader(ctrl)
        if request.path not in OPEN_PATHS:
            header = request.headers.get("Authorization")
            if request.path == NODE_PATH:
                if not ctrl.auth.node(header):
                    return error(401, "nodes must present the cluster key: Authorization: Bearer <key>")
                request[PRINCIPAL] = Principal("node", node=True)
            else:
                principal = ctrl.auth.user(header) or checkpoint_principal(request, header)
                if principal is None:
                    return error(401, "missing or unknown token: set GPUD_TOKEN (or ask an admin for one "
                                      "with gpuctl token create)" if not header else "unknown token")
                request[PRINCIPAL] = principal
        return await handler(request)
    except web.HTTPException as exc:
        if exc.content_type == "application/json":
            raise
        if exc.status == 404:
            return error(404, f"no such endpoint: {request.method} {request.path} (see docs/api.md)")
        if exc.status == 405:
            refused = error(405, f"{request.method} is not allowed on {request.path} (see docs/api.md)")
            refused.headers["Allow"] = exc.headers.get("Allow", "")
            return refused
        return error(exc.status, exc.reason)
    except StoreError as exc:
        refused = error(503, str(exc))
        refused.headers["Retry-After"] = "5"
        return refused
    except (asyncio.CancelledError, ConnectionResetError):
        raise
    except Exception as exc:
        if is_store_failure(exc):  # a read the store failed (the database restarting, say): try again soon
            log.error("the state store failed %s %s: %s", request.method, request.path, exc)
            refused = error(503, f"the state store failed: {str(exc).strip()}; try again")
            refused.headers["Retry-After"] = "5"
            return refused
        log.exception("internal error on %s %s", request.method, request.path)
        return error(500, "internal error; the controller logged the details")
    finally:
        ctrl.api_seconds.observe(time.perf_counter() - began, route)


async def healthz(request: web.Request) -> web.Response:
    """Answered by the event loop itself (gpud.controller.loop_lag): a stuck loop answers nothing."""
    ctrl = request.app[CONTROLLER]
    lag_ms = round(ctrl.loop_lag.worst_s(asyncio.get_running_loop().time()) * 1000.0, 1)
    return web.json_response({"ok": True, "version": __version__, "role": ctrl.role, "term": ctrl.term,
                              "loop_lag_ms": lag_ms,
                              "leader": ctrl.leader_url, "jobs": len(ctrl.cluster.jobs),
                              "nodes": len(ctrl.cluster.nodes), "cycles": ctrl.cycles, "takeover": ctrl.takeover,
                              **({"warm_jobs": len(ctrl.warm)} if ctrl.role == "standby" else {})})


async def metrics(request: web.Request) -> web.Response:
    text = await metrics_view.render(request.app[CONTROLLER])
    return web.Response(text=text, content_type="text/plain", charset="utf-8",
                        headers={"X-Content-Type": "text/plain; version=0.0.4"})


async def state(request: web.Request) -> web.Response:
    api.require_admin(request[PRINCIPAL])
    return web.json_response(live_state(request.app[CONTROLLER]))


async def describe(request: web.Request) -> web.Response:
    return web.json_response(openapi.document())


SCHEDULING = web.AppKey("scheduling", bool)  # whether cycles run on their own (make_app)

LINK_CLOSE_WAIT_S = 2.0  # how long a stopping controller waits for a node to answer its close


def make_app(config: ControllerConfig, clock: Callable[[], float] = time.time,
             scheduling: bool = True) -> web.Application:
    """The controller application; its store, loops and links start and stop with it.

    ``clock`` is the controller's wall clock. With ``scheduling`` false no cycle runs on its own: whoever
    holds the app runs each one with ``await app[CONTROLLER].run_cycle()`` (tests of the API do).
    """
    app = web.Application(middlewares=[guard], client_max_size=int(config.max_body_mib * 1024 * 1024))
    app[CONTROLLER] = Controller(config, clock)
    app[SCHEDULING] = scheduling
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/metrics", metrics)
    app.router.add_get(NODE_PATH, node_connect)
    app.router.add_get("/api/v1/state", state)
    app.router.add_get(openapi.PATH, describe)
    api.add_routes(app)
    tokens_api.add_routes(app)
    checkpoints_api.add_routes(app)
    usage_api.add_routes(app)
    app.cleanup_ctx.append(_running)
    app.on_shutdown.append(_close_node_links)
    ui_server.mount(app)  # after _running: the dashboard starts once the controller is open, stops before it closes
    interactive.add_routes(app)
    return app


async def _close_node_links(app: web.Application) -> None:
    """Close every node's connection as the server stops, so that its handler ends now, not at a timeout."""
    for link in list(app[CONTROLLER].links.values()):
        with contextlib.suppress(Exception):
            await asyncio.wait_for(link.close(), LINK_CLOSE_WAIT_S)


async def _running(app: web.Application) -> AsyncIterator[None]:
    ctrl = app[CONTROLLER]
    loops: list[asyncio.Task] = [asyncio.create_task(ctrl.loop_lag.run(), name="gpud-loop-lag")]

    def start() -> None:
        if app[SCHEDULING]:
            loops.append(asyncio.create_task(ctrl.scheduling_loop(), name="gpud-scheduling"))
        loops.extend([asyncio.create_task(ctrl.node_watch(), name="gpud-node-watch"),
                      asyncio.create_task(ctrl.charger.loop(), name="gpud-charging")])
        ctrl.kick.set()

    leadership = None
    if ctrl.config.postgres:  # serve as a standby at once; lead once the lease is this controller's
        leadership = Leadership(ctrl, start)
        loops.append(asyncio.create_task(leadership.run(), name="gpud-leadership"))
    else:
        await ctrl.open()
        start()
    yield
    for task in loops:
        task.cancel()
    for task in loops:
        with contextlib.suppress(asyncio.CancelledError):
            await task
    for link in list(ctrl.links.values()):
        await link.close()
    await ctrl.close()
    if leadership is not None:
        await leadership.resign()
