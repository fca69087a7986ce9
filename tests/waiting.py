"""Waiting in tests: on a condition, polled, never for a fixed time to "let things happen"."""

from __future__ import annotations

import asyncio
import time
from typing import Any, Callable


def poll(check: Callable[[], Any], timeout: float, interval: float = 0.02) -> Any:
    """Call ``check`` every ``interval`` seconds until it returns something true, and return that; after
    ``timeout`` seconds return its last (false) answer."""
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value or time.monotonic() >= deadline:
            return value
        time.sleep(interval)


async def until(check: Callable[[], Any], what: str, timeout: float = 20.0, interval: float = 0.02) -> Any:
    """Wait, without blocking the event loop, until ``check()`` is true, and return it; fail naming ``what``
    after ``timeout`` seconds."""
    deadline = asyncio.get_running_loop().time() + timeout
    while not (value := check()):
        assert asyncio.get_running_loop().time() < deadline, f"timed out after {timeout:.0f} s waiting for {what}"
        await asyncio.sleep(interval)
    return value


def observe(sample: Callable[[], Any], seconds: float, interval: float = 0.005) -> list[Any]:
    """``sample()`` taken every ``interval`` seconds for ``seconds``: what a test that asserts something holds
    all along (or how often it holds) checks."""
    seen = []
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        seen.append(sample())
        time.sleep(interval)
    return seen


async def loop_turn() -> None:
    """Let the event loop run once: what was scheduled with call_soon (or woken) before now runs first."""
    await asyncio.sleep(0)
