"""The event loop the controller daemon runs on: uvloop's, or asyncio's own when asked.

Every request, heartbeat and command waits for the loop, and a request
needs a few turns of it (accepted, read, answered). uvloop runs those turns'
I/O in libuv, in C, where asyncio's selector loop runs them in Python, so
each turn holds the loop for less. On a live fleet of 2,000 emulated nodes
filled by 16,000 jobs (``bench/fleet.py``), ``/healthz`` answered within
79-90 ms at worst on uvloop, against 100-145 ms on asyncio's loop.

``GPUD_EVENT_LOOP=asyncio`` runs asyncio's own loop instead: for
``bench/loop_stretches.py``, which times each callback through asyncio's
handles, and for comparing the two side by side.
"""

from __future__ import annotations

import asyncio
import os
from typing import Any, Callable, Coroutine, TypeVar

T = TypeVar("T")

ENV = "GPUD_EVENT_LOOP"
LOOPS = ("uvloop", "asyncio")


class EventLoopError(ValueError):
    """GPUD_EVENT_LOOP names no loop gpud knows."""


def chosen() -> str:
    """The loop GPUD_EVENT_LOOP asks for ("uvloop" when unset); EventLoopError for any other value."""
    name = os.environ.get(ENV, "").strip() or LOOPS[0]
    if name not in LOOPS:
        raise EventLoopError(f"{ENV}={name!r} is not a loop gpud knows: use {' or '.join(LOOPS)}")
    return name


def run(main: Coroutine[Any, Any, T]) -> T:
    """Run ``main`` to its end on a new loop of the chosen kind (:func:`chosen`), as ``asyncio.run`` does."""
    factory: Callable[[], asyncio.AbstractEventLoop] | None = None
    try:
        if chosen() == "uvloop":
            import uvloop
            factory = uvloop.new_event_loop
    except BaseException:
        main.close()  # never awaited: closed, so Python does not warn about it
        raise
    with asyncio.Runner(loop_factory=factory) as runner:
        return runner.run(main)


def running_loop_name() -> str:
    """The kind of the loop running now, as :func:`chosen` names them (by the module that made it)."""
    module = type(asyncio.get_running_loop()).__module__
    return "uvloop" if module.startswith("uvloop") else "asyncio"
