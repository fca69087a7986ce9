"""The controller's HTTP server: aiohttp's, with idle connections closed and its own errors answered as JSON.

aiohttp answers a request it cannot parse (a bad request line, an oversized
header) itself, as text and with a traceback in the log; here that answer is
``{"error": ...}`` like every other, and the log gets one line.
"""

from __future__ import annotations

import json
import logging
from http import HTTPStatus
from typing import Any

from aiohttp import web
from aiohttp.web_protocol import RequestHandler

log = logging.getLogger("gpud.controller")
# How long a stopping server waits for requests still being answered (a log followed, a terminal) before it
# cancels them; aiohttp's own default, 60 s, held `gpud up` and the controller that long for a node's socket.
SHUTDOWN_GRACE_S = 3.0


class _JsonErrors(RequestHandler):
    """aiohttp's connection handler, whose own error answers are JSON."""

    def handle_error(self, request: Any, status: int = 500, exc: BaseException | None = None,
                     message: str | None = None) -> web.StreamResponse:
        if request.writer.output_size > 0:
            raise ConnectionError("the answer was already being sent")
        phrase = HTTPStatus(status).phrase if status in HTTPStatus._value2member_map_ else "error"
        if isinstance(exc, ConnectionError):
            log.debug("the client hung up during %s %s", request.method, request.path)
            raise exc
        if status >= 500:
            log.error("internal error on %s %s: %r", request.method, request.path, exc)
            text = "internal error; the controller logged the details"
        else:
            log.debug("bad request from %s: %s", request.remote, message or exc)
            text = f"bad HTTP request ({phrase}): {message or exc or phrase}"
        answer = web.Response(status=status, text=json.dumps({"error": text}), content_type="application/json")
        answer.force_close()
        return answer


class _Server(web.Server):
    __slots__ = ()

    def __call__(self) -> RequestHandler:
        return _JsonErrors(self, loop=self._loop, **self._kwargs)


async def start_runner(app: web.Application, idle_timeout_s: float, **kwargs: Any) -> web.AppRunner:
    """An AppRunner, set up, whose connections close after ``idle_timeout_s`` without a complete request,
    and whose cleanup waits at most SHUTDOWN_GRACE_S for requests still open."""
    kwargs.setdefault("shutdown_timeout", SHUTDOWN_GRACE_S)
    runner = web.AppRunner(app, access_log=None, keepalive_timeout=idle_timeout_s, **kwargs)
    await runner.setup()
    server = runner.server
    if server is not None and type(server) is web.Server:
        server.__class__ = _Server
    return runner
