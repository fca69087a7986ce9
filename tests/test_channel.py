"""The in-memory channel gpud up joins its node and controller with: order, closing, and a full job through it."""

from __future__ import annotations

import asyncio

import pytest

from gpud.channel import local_pair


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
