"""Waiting for an event with a timeout, in loops that must stop when cancelled."""

from __future__ import annotations

import asyncio


async def wait_event(event: asyncio.Event, timeout: float) -> bool:
    """Wait for ``event`` at most ``timeout`` seconds; True when it was set.

    Built on ``asyncio.timeout``: ``asyncio.wait_for`` on Python 3.11 swallows a
    cancellation that arrives just as the event is set, and a loop waiting
    that way then never stops (a node daemon's heartbeats outliving its
    connection, so the daemon's shutdown waited forever).
    """
    try:
        async with asyncio.timeout(timeout):
            await event.wait()
        return True
    except TimeoutError:
        return False
