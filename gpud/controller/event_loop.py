"""The event loop the controller daemon runs on: uvloop's, or asyncio's own when asked.

Every request, heartbeat and command waits for the loop, and a request
needs a few turns of it (accepted, read, answered). uvloop runs those turns'
I/O in libuv, in C, where asyncio's selector loop runs them in Python, so
each turn holds the loop for less. On a live fleet of 2,000 emulated nodes
filled by 16,000 jobs (``bench/fleet.py``), ``/healthz`` answered within
79-90 ms at worst on uvloop, against 100-145 ms on asyncio's loop.

``GPUD_EVENT_LOOP=asyncio`` runs asyncio's own loop instead: for
``bench/loop_stretches.py``, which times each callback through asyncio's
handles, and for comparing the two side by side. Where uvloop cannot be
imported (an install without it), the controller says so and runs on
asyncio's loop, unless ``GPUD_EVENT_LOOP=uvloop`` asked for it by name.
"""

from __future__ import annotations

import asyncio
import logging
import os
from typing import Callable

log = logging.getLogger("gpud.controller")

ENV = "GPUD_EVENT_LOOP"
LOOPS = ("uvloop", "asyncio")


class EventLoopError(ValueError):
    """GPUD_EVENT_LOOP names no loop gpud knows, or uvloop, which cannot be imported."""


def loop_factory() -> Callable[[], asyncio.AbstractEventLoop] | None:
    """What makes the loop GPUD_EVENT_LOOP asks for, uvloop's when unset (None: asyncio's own). EventLoopError for
    a loop gpud does not know; without uvloop installed, asyncio's own with a warning, or EventLoopError when
    GPUD_EVENT_LOOP named uvloop."""
    asked = os.environ.get(ENV, "").strip()
    name = asked or LOOPS[0]
    if name not in LOOPS:
        raise EventLoopError(f"{ENV}={name!r} is not a loop gpud knows: use {' or '.join(LOOPS)}")
    if name == "asyncio":
        return None
    try:
        import uvloop
    except ImportError as exc:
        if asked:
            raise EventLoopError(f"{ENV}=uvloop, but uvloop cannot be imported ({exc}); "
                                 f"install it (pip install uvloop) or unset {ENV}") from None
        log.warning("uvloop cannot be imported (%s): serving on asyncio's own event loop, whose turns are "
                    "longer under many nodes; install uvloop (pip install uvloop)", exc)
        return None
    return uvloop.new_event_loop  # type: ignore[no-any-return]


def running_loop_name() -> str:
    """The kind of the loop running now, as GPUD_EVENT_LOOP names them (by the module that made it)."""
    module = type(asyncio.get_running_loop()).__module__
    return "uvloop" if module.startswith("uvloop") else "asyncio"
