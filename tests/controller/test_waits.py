"""A loop that waits for an event with a timeout stops when cancelled, even as the event is set."""

from __future__ import annotations

import asyncio

import pytest

from gpud.waits import wait_event
from waiting import loop_turn


async def _heartbeats(event: asyncio.Event, beats: list[int]) -> None:
    while True:
        await wait_event(event, 10.0)
        event.clear()
        beats.append(1)


async def test_a_cancel_arriving_as_the_event_is_set_stops_the_loop():
    for _ in range(20):
        event, beats = asyncio.Event(), []
        task = asyncio.create_task(_heartbeats(event, beats))
        await loop_turn()
        event.set()
        await loop_turn()  # the event's waiter is done; the loop has not run on yet
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await asyncio.wait_for(task, 2)


async def test_the_timeout_and_the_event_are_told_apart():
    event = asyncio.Event()
    assert await wait_event(event, 0.01) is False
    event.set()
    assert await wait_event(event, 0.01) is True
