"""The controller loop's time shared out: long work cut into slices, node messages admitted in turns.

The controller's loop answers every node and every request, and it runs
every callback ready at the start of one of its turns before it looks for
more: a plan of 16,000 binds carried out in one go held it for seconds,
and a burst of task exits from a fleet (thousands within a second) served
as they came held it for hundreds of milliseconds; each node's heartbeat,
each ``/healthz`` (which needs four to six turns to be accepted, read and
answered), waited as long or several times as long.

Long work (a plan, the commands it sends, store rows, a batch of submits, a
usage charge) calls :meth:`Slices.pause` between its steps, which lets the
loop turn once SLICE_S is spent. Each node message is a piece that waits
for its turn (:class:`Turns`, one per loop): a turn of the loop runs about
SLICE_S of them. Long work is not queued behind the node messages (a plan
that waited behind every heartbeat for each slice would fill a fleet in
minutes): its slices take turns of their own, one share of long work a
turn of the loop however many pieces of it are under way (a fill carries
out a plan, sends its commands, writes its rows and accepts a batch of
submits at once: four slices a turn held the loop for 20 ms and more), the
pieces in the order they paused. A turn of the loop thus runs a share of
long work and a share of node messages, then reads and answers the rest.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import weakref
from collections import deque

# A turn of the loop runs a share of long work (all of it together) and a share of node messages, then looks at
# everything else: a /healthz waits for four to six turns, each those shares, the reads and requests ready and any
# pass of the garbage collector. Long work's share is SLICE_S; node messages' is SLICE_S, or as much as the rest of
# the turn took, up to MOST_S: on a busy loop the nodes' answers keep about a third of it, while long work (a fill's
# plan, its commands and rows), which nothing waits on by the millisecond, keeps a turn short (a /healthz during a
# fill of 2,000 nodes took 168-178 ms at worst with up to MOST_S of it and the interpreter's lock shared evenly with
# a cycle; 130-134 ms with SLICE_S and the cycle's thread standing aside, gpud.controller.cycle_turns; as fast a fill).
SLICE_S = 0.003
MOST_S = 0.006


class Turns:
    """Pieces of work from many tasks admitted to the loop in turns of about ``slice_s`` each.

    Within one turn of the loop pieces run at once until ``slice_s`` of them
    has run (or, on a loop busy with other work, as much as that work took in
    the last turns, up to ``most_s``); the rest wait, first come first served, for the next
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

    def __init__(self, slice_s: float = SLICE_S, *, most_s: float | None = None) -> None:
        """``most_s``: on a loop whose other work takes more than ``slice_s`` a turn, the pieces get as much as
        it took, up to ``most_s`` (no limit by default; ``slice_s`` keeps them to ``slice_s`` a turn)."""
        self.slice_s = slice_s
        self.most_s = float("inf") if most_s is None else max(slice_s, most_s)
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
        return await self.later()

    async def later(self) -> float:
        """Return at a later turn of the loop (never at once), in line behind the pieces waiting already; with
        the time it began, for :meth:`leave`. For a piece of long work that has run its slice."""
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
            if self.used() < self.budget or not self.used():
                return time.thread_time()
            queue = self.deferred

    def leave(self, began: float, counted: float | None = None) -> None:
        """The piece that :meth:`enter` let begin at ``began`` is done: its time counts against this turn (what
        :meth:`count` counted already, up to ``counted``, is not counted twice)."""
        now = self.count(began if counted is None else counted)
        self.cost += (min(now - began, self.slice_s) - self.cost) / 16

    def count(self, since: float) -> float:
        """Count the CPU time a piece still under way took since ``since`` against this turn; the time now, to be
        given as the next ``since``.

        Many pieces may run in one turn each shorter than its own slice: what they took together is what
        ends the turn's share (a hundred commits woken at once, each sending its commands in a millisecond,
        held the loop for a hundred).
        """
        now = time.thread_time()
        self._open()
        self.spent += now - since
        return now

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
        # While the loop's other work (long work's slice, reads, requests) takes more than a slice a turn, the
        # pieces get as much as it took, up to most_s: they keep about half of a busy loop, so heartbeats are never
        # starved, and a turn of the loop stays short.
        # (A moving average: one long pass of the garbage collector does not make the next turn as long.)
        self.other += (time.thread_time() - self._turn_cpu - self.spent - self.other) / 4
        self.budget = min(max(self.slice_s, self.other), self.most_s)
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
_LONG_TURNS: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, Turns] = weakref.WeakKeyDictionary()


def loop_turns() -> Turns:
    """The running loop's turns for node messages, shared by every piece of work that runs on it."""
    loop = asyncio.get_running_loop()
    turns = _TURNS.get(loop)
    if turns is None:
        turns = _TURNS[loop] = Turns(SLICE_S, most_s=MOST_S)
    return turns


def long_work_turns() -> Turns:
    """The running loop's turns for the slices of long work, all long work together: SLICE_S of them a turn."""
    loop = asyncio.get_running_loop()
    turns = _LONG_TURNS.get(loop)
    if turns is None:
        turns = _LONG_TURNS[loop] = Turns(SLICE_S)
    return turns


class Slices:
    """The clock of one piece of long work on the loop, cut into slices of at most ``slice_s`` seconds each.

    The slices of every piece of long work on the loop take turns
    (:func:`long_work_turns`): a piece that has run its slice, or that
    finds this turn's share of long work spent (by itself or another
    piece), waits in line for a later turn.
    """

    def __init__(self, slice_s: float = MOST_S) -> None:
        self.slice_s = slice_s
        self.turns = long_work_turns()
        self.began = time.perf_counter()
        self.began_cpu = time.thread_time()
        self.counted_cpu = self.began_cpu  # this slice's time counted against the turn up to here
        self.pauses = 0

    async def pause(self) -> None:
        """Let the loop turn when this slice's time is spent, or when this turn's share of long work is, by this
        piece and every other one that ran in it (returns at once otherwise)."""
        self.counted_cpu = self.turns.count(self.counted_cpu)
        if time.perf_counter() - self.began < self.slice_s and self.turns.used() < self.turns.budget:
            return
        self.pauses += 1
        self.turns.leave(self.began_cpu, self.counted_cpu)
        self.began_cpu = self.counted_cpu = await self.turns.later()
        self.began = time.perf_counter()
