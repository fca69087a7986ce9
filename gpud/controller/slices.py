"""The controller loop's time shared out: long work cut into slices, node messages admitted in turns.

The controller's loop answers every node and every request, and it runs
every callback ready at the start of one of its turns before it looks for
more: a plan of 16,000 binds carried out in one go held it for seconds,
and a burst of task exits from a fleet (thousands within a second) served
as they came held it for hundreds of milliseconds; each node's heartbeat,
each ``/healthz`` (which needs a few turns to be read and answered), waited
as long or several times as long.

Long work (a plan, the commands it sends, store rows, a batch of submits, a
usage charge) calls :meth:`Slices.pause` between its steps, which lets the
loop turn once SLICE_S is spent. Each node message is a piece that waits
for its turn (:class:`Turns`, one per loop): a turn of the loop runs about
SLICE_S of them. Long work is not queued behind the node messages (a plan
that waited behind every heartbeat for each slice would fill a fleet in
minutes): a turn of the loop runs at most a slice of each piece of long work
under way and a turn of node messages, then reads and answers the rest.
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
    has run (or, on a loop busy with other work, as much as that work took in
    the last turn); the rest wait, first come first served, for the next
    turns: about as many of them are woken per turn as the pieces' recent
    cost says fit. Pieces of one task keep their order (each awaits its own turn);
    a piece woken into a turn that the pieces woken before it have spent
    waits first in line for the next. The work done in all is the same::

        began = await turns.enter()
        try:
            ...  # the piece
        finally:
            turns.leave(began)
    """

    def __init__(self, slice_s: float = SLICE_S) -> None:
        self.slice_s = slice_s
        self.budget = slice_s        # this turn's: slice_s, or what the loop's other work took in the last turn
        # This turn's pieces so far, in the loop thread's CPU time, the clock the loop's other work is measured
        # by: on a loaded machine wall time also counts the time the thread waited for a core.
        self.spent = 0.0
        self.open = False            # a turn of the loop is under way (it ends at the loop's next turn)
        self.cost = slice_s / 8      # the recent cost of one piece (moving average)
        self.waiting: deque[asyncio.Future] = deque()
        self.deferred: deque[asyncio.Future] = deque()  # woken in a turn already spent: they go first at the next
        self.waits = 0               # pieces that waited for a later turn (for tests and figures)
        self._turn_cpu = 0.0         # the loop thread's CPU time when this turn began
        self.other = 0.0             # the loop's other work in a turn, lately (moving average of its CPU time)

    async def enter(self) -> float:
        """Return when this piece may run (with the time it began, for :meth:`leave`): at once while this turn
        has time left and nobody waits, else at a later turn, in the order the pieces came."""
        if not self.waiting and not self.deferred and self.used() < self.budget:
            self._open()
            return time.thread_time()
        self.waits += 1
        queue = self.waiting
        while True:
            future = asyncio.get_running_loop().create_future()
            queue.append(future)
            self._open()
            try:
                await future
            except asyncio.CancelledError:
                for where in (self.waiting, self.deferred):
                    with contextlib.suppress(ValueError):
                        where.remove(future)
                raise
            if self.used() < self.budget or not self.used():  # time left, or the turn's first piece
                return time.thread_time()
            # The pieces woken with this one (their cost was guessed) spent the turn: first in line at the next.
            queue = self.deferred

    def leave(self, began: float) -> None:
        """The piece that :meth:`enter` let begin at ``began`` is done: its time counts against this turn."""
        spent = time.thread_time() - began
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
            self._turn_cpu = time.thread_time()
            asyncio.get_running_loop().call_soon(self._next_turn)

    def _next_turn(self) -> None:
        # Runs at the loop's next turn: this turn is over; the next batch of waiting pieces runs at the one after.
        # While the loop's other work (long work's slices, reads, requests) takes more than a slice a turn, the
        # pieces get as much as it took: they keep at least half of a busy loop, so heartbeats are never starved.
        # (A moving average: one long pass of the garbage collector does not make the next turn as long.)
        self.other += (time.thread_time() - self._turn_cpu - self.spent - self.other) / 4
        self.budget = max(self.slice_s, self.other)
        self.open = False
        if self.deferred:
            self.waiting.extendleft(reversed(self.deferred))
            self.deferred.clear()
        batch = max(1, int(self.budget / max(self.cost, 1e-6)))
        woken = 0
        while self.waiting and woken < batch:
            future = self.waiting.popleft()
            if not future.done():
                future.set_result(None)
                woken += 1
        if woken:
            self._open()  # after the wakeups: this turn ends once the pieces woken have run


_TURNS: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, Turns] = weakref.WeakKeyDictionary()


def loop_turns() -> Turns:
    """The running loop's turns, shared by every piece of work that runs on it."""
    loop = asyncio.get_running_loop()
    turns = _TURNS.get(loop)
    if turns is None:
        turns = _TURNS[loop] = Turns()
    return turns


class Slices:
    """The clock of one piece of long work on the loop, cut into slices of at most ``slice_s`` seconds each."""

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
