"""The dashboard's own HTTP server, started and stopped with the controller's application."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import AsyncIterator

from aiohttp import web

from gpud.controller.keys import CONTROLLER

log = logging.getLogger("gpud.ui")


@dataclass(slots=True)
class UiServer:
    """Where the dashboard is served: its URL once listening, empty when off or when it could not listen."""

    url: str = ""


UI_SERVER: web.AppKey[UiServer] = web.AppKey("ui_server")


def mount(app: web.Application) -> None:
    """Serve the dashboard beside the controller ``app`` when its configuration says so ([ui] enabled)."""
    app[UI_SERVER] = UiServer()
    app.cleanup_ctx.append(_serving)


async def _serving(app: web.Application) -> AsyncIterator[None]:
    ctrl = app[CONTROLLER]
    if not ctrl.config.ui:
        yield
        return
    from gpud.ui.app import make_ui_app

    ui = make_ui_app(ctrl)
    runner = web.AppRunner(ui, access_log=None, keepalive_timeout=ctrl.config.idle_timeout_s, shutdown_timeout=2.0)
    await runner.setup()
    host, port = ctrl.config.ui_address
    config = ctrl.config
    try:
        from gpud.tls import TlsFileError, server_context
        tls = server_context(config.tls_cert, config.tls_key) if config.tls_cert and config.tls_key else None
    except TlsFileError as exc:
        log.error("the dashboard is not served: %s", exc)
        await runner.cleanup()
        yield
        return
    try:
        await web.TCPSite(runner, host, port, ssl_context=tls).start()
    except OSError as exc:
        # The API matters more than its dashboard: the controller goes on without it.
        log.error("the dashboard is not served: cannot listen on %s:%d (%s); set [ui] listen in controller.toml",
                  host, port, exc.strerror or exc)
        await runner.cleanup()
        yield
        return
    bound = runner.addresses[0][1] if runner.addresses else port
    shown = f"[{host}]" if ":" in host else host
    app[UI_SERVER].url = f"{'https' if tls else 'http'}://{shown}:{bound}/ui/"
    log.info("dashboard on %s", app[UI_SERVER].url)
    try:
        yield
    finally:
        await runner.cleanup()  # its open event streams end first (on_shutdown), then its connections
