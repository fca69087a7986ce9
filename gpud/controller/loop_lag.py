"""How late the controller's event loop has been lately: a tick every TICK_S, the worst lateness over WINDOW_S.

Every request, heartbeat and command waits for the loop, so its lateness
is the controller's own health. ``/healthz`` is answered by the loop
itself (never from another thread): a loop stuck for good answers nothing
and a liveness probe fails, as it should; a loop that was held up shows it
as ``loop_lag_ms`` in the answer, and ``gpud_loop_lag_seconds`` on
``/metrics``, the worst over the last WINDOW_S.
"""

from __future__ import annotations

import asyncio
from collections import deque

TICK_S = 0.1
WINDOW_S = 10.0


class LoopLag:
    """The loop's lateness: :meth:`run` ticks on the loop; :meth:`worst_s` is the worst of the last ``window_s``."""

    def __init__(self, tick_s: float = TICK_S, window_s: float = WINDOW_S) -> None:
        self.tick_s = tick_s
        self.window_s = window_s
        self._worst: deque[tuple[float, float]] = deque()  # (when, lateness), lateness falling left to right

    async def run(self) -> None:
        """Tick every ``tick_s`` on the running loop and note how late each tick came, until cancelled."""
        loop = asyncio.get_running_loop()
        while True:
            due = loop.time() + self.tick_s
            await asyncio.sleep(self.tick_s)
            now = loop.time()
            self.note(now, max(0.0, now - due))

    def note(self, now: float, late_s: float) -> None:
        """A tick due ``late_s`` before ``now`` ran at ``now``."""
        worst = self._worst
        while worst and worst[-1][1] <= late_s:
            worst.pop()  # never the worst again: this one is as late and leaves the window later
        worst.append((now, late_s))
        self._forget(now)

    def worst_s(self, now: float) -> float:
        """The latest tick's lateness at worst over the ``window_s`` before ``now`` (seconds; 0.0 before any)."""
        self._forget(now)
        return self._worst[0][1] if self._worst else 0.0

    def _forget(self, now: float) -> None:
        while self._worst and self._worst[0][0] < now - self.window_s:
            self._worst.popleft()
