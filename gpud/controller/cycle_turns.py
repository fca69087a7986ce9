"""The turns a scheduling cycle run in its own thread gives the event loop's thread (gpud.core.turns).

The compiled core never checks whether another thread waits for the
interpreter's lock; only entering interpreted code does (CPython 3.11 checks
at each function's start). So the core calls :meth:`LoopFirst.give`, a method
of this interpreted module, every ``TURN_EVERY`` steps of its long loops: the
loop's thread, asking for the lock after the switch interval, gets it there.

Handed over only that way, the lock is shared about evenly: a turn of the
loop that needs 15-30 ms of its thread's time took twice as long while a
cycle ran, and a ``/healthz`` (four to six turns) 150 ms and more. The loop
answers every node and every request; a cycle is throughput work. So while
the loop runs late (its note, made every TICK_S, is LATE_S old) the cycle's
thread stands aside, sleeping with the lock free until the loop notes again,
but for no more than LOOP_SHARE of the cycle's time: a cycle on a loop that
stays busy still ends.
"""

from __future__ import annotations

import asyncio
import time
from typing import Final

from gpud.core.turns import EVERY

# Steps of the core's long loops between two turns: about 0.1 ms of compiled work each time, measured
# with bench/cycle_turns.py, for well under 1 % of a cycle's CPU.
TURN_EVERY: Final = EVERY
TICK_S: Final = 0.005        # how often the loop notes that it turns, while a cycle runs in its thread
LATE_S: Final = 0.01         # a note this old: the loop waits for the lock, or runs a long turn
ASIDE_STEP_S: Final = 0.0002  # the cycle's thread sleeps this long at a time while it stands aside
LOOP_SHARE: Final = 0.75     # the most of a cycle's time its thread stands aside for


def give_turn() -> None:
    """The plain turn: give a thread waiting for the interpreter's lock the chance to take it; does nothing else
    (what :meth:`LoopFirst.give` does while the loop keeps up; bench/cycle_turns.py measures what it costs).

    Its being interpreted code is the point: calling it is where the
    interpreter hands the lock over when asked to.
    """


class LoopFirst:
    """The turns of one cycle run in its thread, the loop's thread first (see the module docstring).

    ``start`` on the loop before the cycle, ``stop`` after it; the core calls
    ``give`` in the cycle's thread. What the core decides is the same.
    """

    def __init__(self, loop_share: float = LOOP_SHARE, late_s: float = LATE_S) -> None:
        """``loop_share``: the most of the cycle's time (from ``start``) its thread stands aside for."""
        self.loop_share = loop_share
        self.late_s = late_s
        self.noted = self.began = time.monotonic()
        self.aside = 0.0  # seconds the cycle's thread stood aside since ``start``
        self._tick: asyncio.TimerHandle | None = None

    def start(self) -> None:
        """Begin noting the running loop's turns, for a cycle about to run in its thread."""
        self.began = time.monotonic()
        self.aside = 0.0
        self._note()

    def stop(self) -> None:
        """The cycle ended: stop noting the loop's turns."""
        if self._tick is not None:
            self._tick.cancel()
            self._tick = None

    def _note(self) -> None:
        self.noted = time.monotonic()
        self._tick = asyncio.get_running_loop().call_later(TICK_S, self._note)

    def give(self) -> None:
        """Give a thread waiting for the interpreter's lock the chance to take it, and while the loop runs late,
        stand aside (sleep, the lock free) until it notes again, unless the cycle's thread stood aside for its
        whole share already.

        Its being interpreted code is the point: calling it is where the
        interpreter hands the lock over when asked to.
        """
        now = time.monotonic()
        while now - self.noted >= self.late_s and self.aside < self._share(now):
            time.sleep(ASIDE_STEP_S)
            slept, now = now, time.monotonic()
            self.aside += now - slept

    def _share(self, now: float) -> float:
        """How long the cycle's thread may have stood aside by ``now``: LOOP_SHARE of the time since ``start``."""
        return (now - self.began) * self.loop_share
