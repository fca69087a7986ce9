"""Turns for the daemon: a call it gives, made every so many steps of the core's long loops.

Compiled code never lets another thread take the interpreter's lock until it
calls interpreted code; a cycle run in a thread of its own would otherwise
hold the daemon's event loop for as long as it runs. The core stays pure: it
knows nothing of threads or clocks, it only calls what it was given.
"""

from __future__ import annotations

from typing import Callable, Final

# Steps between two calls: a step is one turn of a long loop (a job taken in, a job walked, a node
# searched, an eviction tried), each a few microseconds of compiled work at most.
EVERY: Final = 64


class Turns:
    """Counts the steps of a cycle's long loops and calls ``give`` every ``every`` steps.

    Without ``give`` a step costs a decrement; the calls never change what
    the core decides (the plan is the same with and without them).
    """

    __slots__ = ("give", "every", "left")

    def __init__(self, give: Callable[[], None] | None = None, every: int = EVERY) -> None:
        """``give``: called every ``every`` steps (at least 1); None gives no turns."""
        if every < 1:
            raise ValueError(f"turns every {every} steps: at least 1 is needed")
        self.give: Callable[[], None] | None = give
        self.every: int = every
        self.left: int = every

    def step(self) -> None:
        """One step of a long loop done: ``give`` is called when ``every`` of them have been."""
        self.left -= 1
        if self.left <= 0:
            self.left = self.every
            give = self.give
            if give is not None:
                give()


# The turns of a core that gives none: shared, for it never calls anything.
NO_TURNS: Final = Turns()
