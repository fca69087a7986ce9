"""The turn a scheduling cycle run in its own thread gives the event loop's thread (gpud.core.turns).

The compiled core never checks whether another thread waits for the
interpreter's lock; only entering interpreted code does (CPython 3.11 checks
at each function's start). So the core calls ``give_turn``, a function of
this interpreted module, every ``TURN_EVERY`` steps of its long loops: the
loop's thread, asking for the lock after the switch interval, gets it there.
"""

from __future__ import annotations

from typing import Final

from gpud.core.turns import EVERY

# Steps of the core's long loops between two turns: about 0.1 ms of compiled work each time, measured
# with bench/cycle_turns.py, for well under 1 % of a cycle's CPU.
TURN_EVERY: Final = EVERY


def give_turn() -> None:
    """Give a thread waiting for the interpreter's lock the chance to take it; does nothing else.

    Its being interpreted code is the point: calling it is where the
    interpreter hands the lock over when asked to.
    """
