"""The in-memory channel gpud up joins its node and controller with: order, closing, and recovery from a failure."""

from __future__ import annotations

import asyncio

import pytest

from gpud.channel import local_pair
from waiting import until


async def _collect(texts) -> list[str]:
    return [text async for text in texts]


async def test_texts_arrive_in_order_and_closing_either_end_ends_both():
    node, controller = local_pair()
    at_controller = asyncio.create_task(_collect(controller.texts()))
    at_node = asyncio.create_task(_collect(node.texts()))
    for text in ("register", "task 1", "task 2"):
        await node.send_str(text)
    await controller.send_str("registered")
    await controller.close()
    assert await asyncio.wait_for(at_controller, 5) == ["register", "task 1", "task 2"]
    assert await asyncio.wait_for(at_node, 5) == ["registered"]
    assert node.closed and controller.closed


async def test_sending_on_a_closed_channel_is_a_connection_error():
    node, controller = local_pair()
    await node.close()
    with pytest.raises(ConnectionError):
        await controller.send_str("start")
    with pytest.raises(ConnectionError):
        await node.send_str("task")


async def test_the_in_process_node_registers_again_when_serving_it_failed(tmp_path, monkeypatch):
    from aiohttp import web

    from gpud.controller.app import make_app
    from gpud.controller.config import ControllerConfig
    from gpud.controller.keys import CONTROLLER
    from gpud.controller.node_link import connect_in_process
    from gpud.gpu.fake import FakeBackend
    from gpud.node.agent import NodeAgent
    from gpud.node.config import NodeConfig
    from node_helpers import kill_everything

    policy = tmp_path / "policy.toml"
    policy.write_text('[[projects]]\nname = "default"\ngpu_quota = 1\n')
    app = make_app(ControllerConfig(state_dir=str(tmp_path / "controller"), policy=str(policy), heartbeat_s=0.1,
                                    init=True, ui=False))
    runner = web.AppRunner(app)
    await runner.setup()  # the controller's loops run; it listens on no port
    ctrl = app[CONTROLLER]
    node_dir = tmp_path / "node"
    agent = NodeAgent(NodeConfig(state_dir=str(node_dir), name="n1", gpu_backend="fake", fake_gpus=1,
                                 reconnect_max_s=0.2), FakeBackend("n1", 1, str(node_dir)),
                      connect=connect_in_process(ctrl))
    try:
        await agent.start()
        await _until(lambda: agent.link.registrations == 1 and "n1" in ctrl.links)
        real_heartbeat = ctrl.cluster.node_messages.heartbeat

        def failing_once(*args, **kwargs):
            monkeypatch.setattr(ctrl.cluster.node_messages, "heartbeat", real_heartbeat)
            raise RuntimeError("a bug in the controller")

        monkeypatch.setattr(ctrl.cluster.node_messages, "heartbeat", failing_once)
        await _until(lambda: agent.link.registrations == 2 and "n1" in ctrl.links)
        assert ctrl.cluster.nodes["n1"].state == "up"
    finally:
        await agent.stop()
        await runner.cleanup()
        kill_everything(str(node_dir))


async def _until(check, timeout: float = 10.0) -> None:
    await until(check, str(check), timeout)


async def test_a_stuck_controller_side_does_not_hold_up_the_node_leaving(monkeypatch):
    from gpud.controller import node_link

    ended = asyncio.Event()

    async def stuck(ctrl, channel, texts, peer):
        try:
            await asyncio.Event().wait()  # never reads the close
        finally:
            ended.set()

    monkeypatch.setattr(node_link, "serve_node", stuck)
    monkeypatch.setattr(node_link, "LOCAL_CLOSE_WAIT_S", 0.2)
    connect = node_link.connect_in_process(None)

    async def connect_and_leave():
        async with connect() as (channel, _):
            await channel.send_str("register")

    await asyncio.wait_for(connect_and_leave(), 5)
    assert ended.is_set()  # the stuck serving task was cancelled, not left behind


async def _ws_server(handler):
    """A real aiohttp server on 127.0.0.1 whose one route is the WebSocket ``handler``; (runner, url)."""
    from aiohttp import web

    app = web.Application()
    app.router.add_get("/ws", handler)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    return runner, f"http://127.0.0.1:{port}/ws"


@pytest.mark.parametrize("ending", ["close", "drop"])
async def test_a_websocket_gives_its_texts_in_order_skips_binary_and_ends_with_the_connection(ending):
    import aiohttp
    from aiohttp import web

    from gpud.channel import ws_texts

    read: list[str] = []
    done = asyncio.Event()

    async def handler(request):
        ws = web.WebSocketResponse()
        await ws.prepare(request)
        try:
            async for text in ws_texts(ws):
                read.append(text)
        finally:
            done.set()
        return ws

    runner, url = await _ws_server(handler)
    try:
        async with aiohttp.ClientSession() as session:
            ws = await session.ws_connect(url)
            await ws.send_str("register")
            await ws.send_bytes(b"not a text")
            await ws.ping()
            await ws.send_str("heartbeat")
            await until(lambda: len(read) == 2, "both texts read")
            if ending == "close":
                await ws.close()
            else:  # the node's host goes away without a close frame
                ws._response.connection.transport.abort()
            await asyncio.wait_for(done.wait(), 10)
        assert read == ["register", "heartbeat"]
    finally:
        await runner.cleanup()

