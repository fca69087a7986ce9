"""Typed keys for what the aiohttp application and its requests carry."""

from __future__ import annotations

from typing import TYPE_CHECKING

from aiohttp import web

if TYPE_CHECKING:
    from gpud.controller.auth import Principal
    from gpud.controller.service import Controller

CONTROLLER: web.AppKey["Controller"] = web.AppKey("controller")
PRINCIPAL: web.RequestKey["Principal"] = web.RequestKey("gpud_principal")
