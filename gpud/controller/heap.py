"""Keeping the cyclic garbage collector's full passes short on a heap of long-lived objects.

A full pass (generation 2) walks every object the collector tracks while it
holds the GIL, so every thread waits for it: the event loop, and every
heartbeat and ``/healthz`` behind it. Most of a controller's heap lives long
(jobs, their runs, nodes, connections) and its full passes grow with it: at
2,000 nodes and 16,000 jobs they took 46-182 ms of CPU and freed next to
nothing.

CPython's answer for such heaps is ``gc.freeze()``: no later pass walks what
it moves to the permanent generation. The controller freezes after start-up
and after large submits; :class:`FullPasses` also freezes at the end of any
full pass that took FREEZE_AFTER_S or more, the one moment when every object
tracked has just been found alive, so nothing frozen is garbage then. A
collection at the loop's next turn then starts CPython's count of long-lived
objects afresh from the few left unfrozen (a full pass waits until that count
has grown by a quarter), so the next full passes walk only what was made
since the freeze, and one that grew long freezes again.

A frozen object is still freed when its last reference goes; only a
reference cycle among frozen objects that becomes garbage later is never
collected (the objects alive at a freeze are the controller's state and
what was in flight at that instant). Freezes come only after the heap grew
by a long pass's worth of live objects since the last one.

Some of what a full pass walks cannot be frozen for good: the waiting
state of every node connection, renewed with each of its messages. At
2,000 nodes that is 35,000-45,000 objects, a full pass of 20-60 ms however
often the rest is frozen, so full passes come FULL_PASS_EVERY passes of the
middle generation apart (about a minute under a fleet's load) rather than
CPython's ten.
"""

from __future__ import annotations

import asyncio
import gc
import time

FREEZE_AFTER_S = 0.01  # a full pass this long (CPU time) freezes what it found alive
# Passes of the middle generation between two full passes (CPython's default: 10). Each full pass walks every
# object that is not frozen, at 2,000 nodes the waiting state of every node connection among them (35,000-45,000
# objects, 20-60 ms while the loop waits), and frees next to nothing: one a minute, rather than one every few
# seconds, stalls the loop ten times less often. Garbage in reference cycles lives that much longer.
FULL_PASS_EVERY = 100


class FullPasses:
    """Times the collector's full passes and freezes the survivors of a long one (see the module docstring)."""

    def __init__(self, loop: asyncio.AbstractEventLoop, freeze_after_s: float = FREEZE_AFTER_S) -> None:
        self.loop = loop
        self.freeze_after_s = freeze_after_s
        self.passes = 0
        self.seconds = 0.0        # CPU time of every full pass so far
        self.longest_s = 0.0
        self.freezes = 0
        self._began = 0.0
        self._thresholds: tuple[int, ...] | None = None  # the collector's, before install

    def install(self) -> None:
        """Start timing (and freezing after) the full passes of this process, and make them FULL_PASS_EVERY
        middle-generation passes apart."""
        if self._observe not in gc.callbacks:
            gc.callbacks.append(self._observe)
        if self._thresholds is None:
            self._thresholds = gc.get_threshold()
            young, middle = self._thresholds[:2]
            gc.set_threshold(young, middle, FULL_PASS_EVERY)

    def uninstall(self) -> None:
        """Stop: later passes are neither timed nor followed by a freeze, and come as often as before install."""
        if self._observe in gc.callbacks:
            gc.callbacks.remove(self._observe)
        if self._thresholds is not None:
            gc.set_threshold(*self._thresholds)
            self._thresholds = None

    def _observe(self, phase: str, info: dict) -> None:
        # Runs inside the collection, in whichever thread triggered it, with the GIL held.
        if info.get("generation") != 2:
            return
        if phase == "start":
            self._began = time.thread_time()
            return
        spent = time.thread_time() - self._began
        self.passes += 1
        self.seconds += spent
        self.longest_s = max(self.longest_s, spent)
        if spent >= self.freeze_after_s:
            gc.freeze()
            self.freezes += 1
            try:
                self.loop.call_soon_threadsafe(_recount)
            except RuntimeError:  # the loop is closed: nothing runs on it any more, so no pass stalls it
                pass


def _recount() -> None:
    # Right after a freeze this walks only what was made since (a collection cannot start inside another's
    # callback, hence a turn of the loop later); it leaves CPython's long-lived count at what stays unfrozen.
    gc.collect()
