"""The controller loop's time shared out: long work cut into slices, many small pieces admitted in turns.

The controller's loop answers every node and every request, and it runs
every callback ready at the start of one of its turns before it looks for
more: a plan of 16,000 binds carried out in one go held it for seconds,
and a burst of task exits from a fleet (thousands within a second) served
as they came held it for hundreds of milliseconds; each node's heartbeat,
each ``/healthz`` (which needs a few turns to be read and answered), waited
as long or several times as long.

So the loop's turns have a budget, SLICE_S, shared by all such work
(:class:`Turns`, one per loop): each node message is a piece that waits
for its turn (:meth:`Turns.enter`), and long work (a plan, the commands it
sends, store rows, a batch of submits, a usage charge) calls
:meth:`Slices.pause` between its steps, which lets the loop turn once its
own slice or the turn's budget is spent and then waits for its turn as a
node message does. Whatever is not such work (reading sockets, answering a
request) runs between turns.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import weakref
from collections import deque

SLICE_S = 0.005  # the most such work the loop runs in one of its turns before it looks at anything else


class Turns:
    """Pieces of work from many tasks admitted to the loop in turns of about ``slice_s`` each.

    Within one turn of the loop pieces run at once until ``slice_s`` of them
    has run; the rest wait, first come first served, for the next turns:
    about ``slice_s`` of them are woken per turn, as the pieces' recent cost
    says. Pieces of one task keep their order (each awaits its own turn);
    the work done in all is the same::

        began = await turns.enter()
        try:
            ...  # the piece
        finally:
            turns.leave(began)
    """

    def __init__(self, slice_s: float = SLICE_S) -> None:
        self.slice_s = slice_s
        self.spent = 0.0             # this turn's pieces so far (wall time, as the loop's own)
        self.open = False            # a turn of the loop is under way (it ends at the loop's next turn)
        self.cost = slice_s / 8      # the recent cost of one piece (moving average)
        self.waiting: deque[asyncio.Future] = deque()
        self.waits = 0               # pieces that waited for a later turn (for tests and figures)

    async def enter(self) -> float:
        """Return when this piece may run (with the time it began, for :meth:`leave`): at once while this turn
        has time left and nobody waits, else at a later turn, in the order the pieces came."""
        if not self.waiting and self.used() < self.slice_s:
            self._open()
            return time.perf_counter()
        self.waits += 1
        future = asyncio.get_running_loop().create_future()
        self.waiting.append(future)
        self._open()
        try:
            await future
        except asyncio.CancelledError:
            if not future.done() or future.cancelled():
                with contextlib.suppress(ValueError):
                    self.waiting.remove(future)
            raise
        return time.perf_counter()

    def leave(self, began: float) -> None:
        """The piece that :meth:`enter` let begin at ``began`` is done: its time counts against this turn."""
        spent = time.perf_counter() - began
        self._open()
        self.spent += spent
        self.cost += (min(spent, self.slice_s) - self.cost) / 16

    def used(self) -> float:
        """How much of this turn of the loop the pieces have taken so far."""
        return self.spent if self.open else 0.0

    def _open(self) -> None:
        if not self.open:
            self.open = True
            self.spent = 0.0
            asyncio.get_running_loop().call_soon(self._next_turn)

    def _next_turn(self) -> None:
        # Runs at the loop's next turn: this turn is over; the next batch of waiting pieces runs at the one after.
        self.open = False
        if not self.waiting:
            return
        self._open()
        room = max(1, int(self.slice_s / max(self.cost, 1e-6)))
        while self.waiting and room:
            future = self.waiting.popleft()
            if not future.done():
                future.set_result(None)
                room -= 1


_TURNS: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, Turns] = weakref.WeakKeyDictionary()


def loop_turns() -> Turns:
    """The running loop's turns, shared by every piece of work that runs on it."""
    loop = asyncio.get_running_loop()
    turns = _TURNS.get(loop)
    if turns is None:
        turns = _TURNS[loop] = Turns()
    return turns


class Slices:
    """The clock of one piece of long work on the loop, cut into slices of at most ``slice_s`` seconds each
    that take their turns with the loop's other work (see the module docstring)."""

    def __init__(self, slice_s: float = SLICE_S) -> None:
        self.slice_s = slice_s
        self.began = time.perf_counter()
        self.pauses = 0

    async def pause(self) -> None:
        """Let the loop turn when this slice's time, or the loop's turn, is spent, and wait for a later turn
        (returns at once otherwise)."""
        turns = loop_turns()
        spent = time.perf_counter() - self.began
        if spent >= self.slice_s or turns.used() + spent >= turns.slice_s:
            self.pauses += 1
            turns.leave(self.began)
            await asyncio.sleep(0)
            self.began = await turns.enter()
