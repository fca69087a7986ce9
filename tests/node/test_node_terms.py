"""A node's link to several controllers: it finds the leader past a standby, and ignores an older term's orders."""

from __future__ import annotations

import asyncio
import json

from aiohttp import web

from gpud.node.link import ControllerLink, node_url
from waiting import until

KEY = "k"


class Owner:
    """The node's side, reduced to what the link asks: it records the orders it is given."""

    def __init__(self) -> None:
        self.orders: list[dict] = []

    def register_message(self) -> dict:
        return {"type": "register", "node": "n1", "tasks": []}

    def heartbeat_message(self) -> dict:
        return {"type": "heartbeat", "tasks": []}

    def registered(self, message: dict) -> None:
        pass

    async def handle(self, message: dict) -> dict | None:
        self.orders.append(message)
        return None

    def lease_renewed(self, expires, lease_s, grace_s) -> None:
        pass


async def serve(handler) -> tuple[web.AppRunner, str]:
    app = web.Application()
    app.router.add_get("/api/v1/node/connect", handler)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]
    return runner, f"http://127.0.0.1:{port}"


async def wait_until(check, timeout: float = 10.0) -> None:
    await until(check, str(check), timeout)


async def test_a_node_goes_past_a_standby_to_the_leader_and_ignores_an_older_term():
    leader_ws: list[web.WebSocketResponse] = []
    standby_asked = 0
    leader_url = ""

    async def standby(request: web.Request) -> web.StreamResponse:
        nonlocal standby_asked
        standby_asked += 1
        return web.json_response({"error": "standby", "role": "standby", "leader": leader_url}, status=503,
                                 headers={"X-Gpud-Leader": leader_url})

    async def leader(request: web.Request) -> web.StreamResponse:
        ws = web.WebSocketResponse()
        await ws.prepare(request)
        leader_ws.append(ws)
        async for frame in ws:
            if json.loads(frame.data)["type"] == "register":
                await ws.send_json({"type": "registered", "heartbeat_s": 5, "term": 3})
        return ws

    standby_runner, standby_url = await serve(standby)
    leader_runner, leader_url = await serve(leader)
    owner = Owner()
    link = ControllerLink([node_url(standby_url), node_url(leader_url)], KEY, owner)
    running = asyncio.create_task(link.run())
    try:
        await asyncio.wait_for(link.connected.wait(), 10)
        assert standby_asked == 1 and link.url == node_url(leader_url) and link.term == 3
        ws = leader_ws[-1]
        await ws.send_json({"type": "stop", "job": "old", "term": 2})   # a deposed leader's order
        await ws.send_json({"type": "stop", "job": "new", "term": 3})
        await ws.send_json({"type": "stop", "job": "later", "term": 4})  # a newer leader: its term is taken
        await ws.send_json({"type": "stop", "job": "stale", "term": 3})
        await ws.send_json({"type": "stop", "job": "last", "term": 4})  # taken after "stale" was weighed
        await wait_until(lambda: len(owner.orders) >= 3)
        assert [order["job"] for order in owner.orders] == ["new", "later", "last"]
        assert link.term == 4
    finally:
        running.cancel()
        await asyncio.gather(running, return_exceptions=True)
        await standby_runner.cleanup()
        await leader_runner.cleanup()


async def test_a_node_refuses_a_leader_of_an_older_term_and_tries_the_next():
    async def stale(request: web.Request) -> web.StreamResponse:
        ws = web.WebSocketResponse()
        await ws.prepare(request)
        async for frame in ws:
            if json.loads(frame.data)["type"] == "register":
                await ws.send_json({"type": "registered", "heartbeat_s": 5, "term": 1})
        return ws

    async def current(request: web.Request) -> web.StreamResponse:
        ws = web.WebSocketResponse()
        await ws.prepare(request)
        async for frame in ws:
            if json.loads(frame.data)["type"] == "register":
                await ws.send_json({"type": "registered", "heartbeat_s": 5, "term": 2})
        return ws

    stale_runner, stale_url = await serve(stale)
    current_runner, current_url = await serve(current)
    link = ControllerLink([node_url(stale_url), node_url(current_url)], KEY, Owner())
    link.term = 2  # heard from the current leader before
    running = asyncio.create_task(link.run())
    try:
        await asyncio.wait_for(link.connected.wait(), 10)
        assert link.url == node_url(current_url) and link.registrations == 1
    finally:
        running.cancel()
        await asyncio.gather(running, return_exceptions=True)
        await stale_runner.cleanup()
        await current_runner.cleanup()
