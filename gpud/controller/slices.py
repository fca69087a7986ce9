"""Long work on the event loop cut into slices of bounded time, the loop free for everyone else between them.

The controller's loop answers every node and every request: a plan of
16,000 binds carried out in one go held it for seconds, and each node's
heartbeat, each ``/healthz``, waited as long. Work done a piece at a time
calls :meth:`Slices.pause` after each piece; the loop turns once the
slice's time is spent.
"""

from __future__ import annotations

import asyncio
import time

SLICE_S = 0.005  # the longest the loop runs one piece of such work before it turns


class Slices:
    """The clock of one piece of work cut into slices of at most ``slice_s`` seconds each."""

    def __init__(self, slice_s: float = SLICE_S) -> None:
        self.slice_s = slice_s
        self.began = time.perf_counter()
        self.pauses = 0

    async def pause(self) -> None:
        """Let the loop turn when this slice's time is spent (returns at once otherwise)."""
        if time.perf_counter() - self.began >= self.slice_s:
            self.pauses += 1
            await asyncio.sleep(0)
            self.began = time.perf_counter()
