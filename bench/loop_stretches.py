"""Run a gpud command with the CPU time of every event-loop callback measured; at exit, the longest ones.

    python bench/loop_stretches.py OUT.json controller --config ... [the gpud command's arguments]

Each callback the loop runs (a task's step from one await to the next, an
I/O or timer callback) holds the loop for its whole time: whatever else is
ready, a node's heartbeat, a ``/healthz``, waits behind it. Its CPU time
(``time.thread_time``), unlike its wall time, does not grow when the
machine's other work takes the CPU away, so these figures can be compared
between runs on a busy machine. OUT.json gets the callbacks' count and CPU
time, how many took 10 ms and 100 ms or more, the 20 longest (each named
by its coroutine and the lines of gpud it ran from and to, or by its
callback), and the collector's full passes, which stop the loop when they
run on its thread: how many, the longest and their CPU time in all.
SIGUSR1 starts the count afresh; SIGUSR2 writes OUT.json now (so that
what a caller then asks of the daemon is left out). The daemon runs on
asyncio's own loop here (GPUD_EVENT_LOOP=asyncio), whose handles are timed,
not on uvloop's.

From SIGUSR1 on, a probe on the loop also asks to wake every LAG_EVERY_S
and notes each wake-up late by LAG_STALL_S or more (a request arriving
then waited as long): how late, and what the process did meanwhile, as CPU
time of the loop's thread, of each other thread (the scheduling cycle's,
the store's), of the collector's passes by generation, the longest loop
callback, and the whole process. Wall time the process did not spend on a
CPU is the machine's other load; the cycle's thread's CPU beside a loop
thread that ran little is the loop waiting for the GIL. The loop thread's
CPU time between two of the probe's wake-ups (held_cpu_ms: percentiles
and the largest) is how long the loop's own work kept a request waiting,
whatever the machine's other load; a request that needs a few turns of the
loop waits a few of these. The collector's passes are counted by
generation (all, of 10 ms or more, of 20 ms or more, the longest), and a
long callback says how much of it the collector took.
"""

from __future__ import annotations

import asyncio.events
import atexit
import collections
import gc
import heapq
import json
import os
import signal
import sys
import threading
import time

KEPT = 20
_run = asyncio.events.Handle._run
_longest: list[tuple[float, int, str]] = []
_totals = {"callbacks": 0, "cpu_s": 0.0, "over_10ms": 0, "over_100ms": 0, "gc_full": 0, "gc_full_max_ms": 0.0,
           "gc_full_s": 0.0}
_gc_began = [0.0]
LAG_EVERY_S = 0.01
LAG_STALL_S = 0.1
LAG_KEPT = 40
_gc_by_gen = [0.0, 0.0, 0.0]  # CPU time of the collector's passes so far, by generation (every thread)
_gc_threads: dict[str, float] = {}  # ... and by the thread that ran them
_gc_in_callback = [0.0]  # CPU time of the collector's passes on the loop's thread within the callback running now
_gc_longest_ms = [0.0, 0.0, 0.0]  # the longest pass of each generation since SIGUSR1 (every thread)
# With GPUD_STRETCHES_CENSUS=1, after each of the first CENSUS_KEPT passes of CENSUS_AFTER_S or more: how many
# objects the pass left in the generation it moved its survivors to, and of which types (what the next passes walk).
# Counting them stalls the process a little more, hence only when asked.
_CENSUS = os.environ.get("GPUD_STRETCHES_CENSUS") == "1"
CENSUS_AFTER_S = 0.015
CENSUS_KEPT = 6
_census: list = []
_gc_passes = [[0, 0, 0], [0, 0, 0], [0, 0, 0]]  # since SIGUSR1, by generation: passes, of 10 ms or more, of 20 ms or more
# Since the probe's last wake-up: the longest loop callback, and the callbacks' CPU time by what ran them.
_window: dict = {"callback_s": 0.0, "callback": "", "kinds": {}}
_lag: dict = {"armed": False, "stalls": [], "ticks": 0, "late_max_ms": 0.0, "over_stall": 0, "held": []}


def _deepest(coro) -> str:
    """Where the innermost gpud coroutine awaited from ``coro`` stands ("" when none is gpud's)."""
    found = None
    while coro is not None:
        frame = getattr(coro, "cr_frame", None) or getattr(coro, "gi_frame", None)
        if frame is not None and "gpud" in frame.f_code.co_filename:
            found = frame
        coro = getattr(coro, "cr_await", None) or getattr(coro, "gi_yieldfrom", None)
    if found is None:
        return ""
    return f"{found.f_code.co_qualname} ({found.f_code.co_filename.rsplit('/', 2)[-1]}:{found.f_lineno})"


def _coro_of(handle: asyncio.events.Handle):
    task = getattr(handle._callback, "__self__", None)
    return task.get_coro() if isinstance(task, asyncio.Task) else None


def _timed(handle: asyncio.events.Handle) -> None:
    if _lag["armed"]:
        _lag["armed"] = False
        _LagProbe(asyncio.get_running_loop()).tick()
    coro = _coro_of(handle)
    before = _deepest(coro) if coro is not None else ""
    _gc_in_callback[0] = 0.0
    began = time.thread_time()
    try:
        _run(handle)
    finally:
        spent = time.thread_time() - began
        kind = getattr(coro, "__qualname__", None) or getattr(handle._callback, "__qualname__", "?")
        count, cpu = _window["kinds"].get(kind, (0, 0.0))
        _window["kinds"][kind] = (count + 1, cpu + spent)
        _totals["callbacks"] += 1
        _totals["cpu_s"] += spent
        if spent >= 0.01:
            _totals["over_10ms"] += 1
            _totals["over_100ms"] += spent >= 0.1
            if coro is None:
                what = repr(handle._callback)[:200]
            else:
                what = f"{getattr(coro, '__qualname__', coro)}: from {before or '?'} to {_deepest(coro) or 'its end'}"
            if _gc_in_callback[0] >= 0.001:
                what += f" (the collector: {_gc_in_callback[0] * 1000.0:.1f} ms of it)"
            entry = (spent, _totals["callbacks"], what)
            if spent > _window["callback_s"]:
                _window["callback_s"], _window["callback"] = spent, what
            if len(_longest) < KEPT:
                heapq.heappush(_longest, entry)
            elif entry > _longest[0]:
                heapq.heapreplace(_longest, entry)


def _thread_clocks() -> dict[str, float]:
    """CPU time so far of every live thread but the caller's, by name."""
    found = {}
    for thread in threading.enumerate():
        if thread.ident is None or thread.ident == threading.get_ident():
            continue
        try:
            found[thread.name] = time.clock_gettime(time.pthread_getcpuclockid(thread.ident))
        except (OSError, ValueError):
            pass
    return found


class _LagProbe:
    """Wakes every LAG_EVERY_S on the loop and notes each wake-up late by LAG_STALL_S or more (see the module
    docstring)."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.began = time.perf_counter()
        self.last = self._clocks()

    def _clocks(self) -> dict:
        return {"wall": time.perf_counter(), "loop": time.thread_time(), "process": time.process_time(),
                "threads": _thread_clocks(), "gc": list(_gc_by_gen), "gc_threads": dict(_gc_threads)}

    def tick(self) -> None:
        now = self._clocks()
        due = self.last["wall"] + LAG_EVERY_S
        late = now["wall"] - due
        _lag["ticks"] += 1
        _lag["late_max_ms"] = max(_lag["late_max_ms"], late * 1000.0)
        _lag["held"].append(now["loop"] - self.last["loop"])
        if late >= LAG_STALL_S:
            _lag["over_stall"] += 1
            ms = lambda a, b: round((a - b) * 1000.0, 1)  # noqa: E731
            stall = {"at_s": round(due - self.began, 2), "late_ms": ms(now["wall"], due),
                     "loop_cpu_ms": ms(now["loop"], self.last["loop"]),
                     "process_cpu_ms": ms(now["process"], self.last["process"]),
                     "threads_cpu_ms": {name: ms(spent, self.last["threads"].get(name, 0.0))
                                        for name, spent in now["threads"].items()
                                        if spent - self.last["threads"].get(name, 0.0) >= 0.001},
                     "gc_ms_by_generation": [ms(a, b) for a, b in zip(now["gc"], self.last["gc"])],
                     "gc_ms_by_thread": {name: ms(spent, self.last["gc_threads"].get(name, 0.0))
                                         for name, spent in now["gc_threads"].items()
                                         if spent - self.last["gc_threads"].get(name, 0.0) >= 0.001},
                     "longest_callback_ms": round(_window["callback_s"] * 1000.0, 1),
                     "longest_callback": _window["callback"],
                     "callbacks_by_cpu": [[kind, count, round(cpu * 1000.0, 1)] for kind, (count, cpu) in
                                          sorted(_window["kinds"].items(), key=lambda item: -item[1][1])[:4]]}
            _lag["stalls"].append(stall)
            _lag["stalls"].sort(key=lambda s: -s["late_ms"])
            del _lag["stalls"][LAG_KEPT:]
        _window["callback_s"], _window["callback"], _window["kinds"] = 0.0, "", {}
        self.last = self._clocks()
        self.loop.call_at(self.loop.time() + LAG_EVERY_S, self.tick)


def _write(path: str) -> None:
    found = {**{k: v for k, v in _totals.items() if k != "written"}, "cpu_s": round(_totals["cpu_s"], 3),
             "gc_full_s": round(_totals["gc_full_s"], 3), "gc_full_max_ms": round(_totals["gc_full_max_ms"], 1),
             "gc_longest_ms_by_generation": [round(ms, 1) for ms in _gc_longest_ms],
             "gc_passes_by_generation": [list(counts) for counts in _gc_passes], "gc_census": _census,
             "longest_ms": [[round(spent * 1000.0, 1), what] for spent, _, what in sorted(_longest, reverse=True)],
             "lag": {"ticks": _lag["ticks"], "late_max_ms": round(_lag["late_max_ms"], 1),
                     "stalls_over_100ms": _lag["over_stall"], "longest_stalls": _lag["stalls"],
                     "held_cpu_ms": _spread(_lag["held"])}}
    with open(path, "w", encoding="utf-8") as f:
        json.dump(found, f, indent=1)


def _spread(seconds: list[float]) -> dict[str, float]:
    """The 50th, 90th, 99th and 99.9th percentiles and the largest of these times, in ms."""
    ordered = sorted(seconds)
    if not ordered:
        return {}
    at = lambda q: round(ordered[min(len(ordered) - 1, int(q * len(ordered)))] * 1000.0, 1)  # noqa: E731
    return {"p50": at(0.5), "p90": at(0.9), "p99": at(0.99), "p99.9": at(0.999), "max": round(ordered[-1] * 1000.0, 1)}


def _write_once(path: str) -> None:
    if not _totals.get("written"):
        _write(path)
        _totals["written"] = 1


def _reset() -> None:
    _longest.clear()
    _totals.update({"callbacks": 0, "cpu_s": 0.0, "over_10ms": 0, "over_100ms": 0, "gc_full": 0,
                    "gc_full_max_ms": 0.0, "gc_full_s": 0.0})
    _gc_longest_ms[:] = [0.0, 0.0, 0.0]
    _gc_passes[:] = [[0, 0, 0], [0, 0, 0], [0, 0, 0]]
    _lag["armed"] = not _lag["ticks"]  # the probe starts at the loop's next callback (once)


def _collecting(phase: str, info: dict) -> None:
    """Time the collector's passes (the full ones, generation 2, apart), which stop whichever thread triggers
    them."""
    if phase == "start":
        _gc_began[0] = time.thread_time()
        return
    spent = time.thread_time() - _gc_began[0]
    generation = info.get("generation", 0)
    _gc_by_gen[generation] += spent
    _gc_longest_ms[generation] = max(_gc_longest_ms[generation], spent * 1000.0)
    if _CENSUS and spent >= CENSUS_AFTER_S and len(_census) < CENSUS_KEPT:
        survivors = gc.get_objects(min(generation + 1, 2))
        _census.append({"generation": generation, "ms": round(spent * 1000, 1), "survivors": len(survivors),
                        "thread": threading.current_thread().name,
                        "types": collections.Counter(type(o).__name__ for o in survivors).most_common(12)})
        del survivors
    counts = _gc_passes[generation]
    counts[0] += 1
    counts[1] += spent >= 0.01
    counts[2] += spent >= 0.02
    if threading.current_thread() is threading.main_thread():
        _gc_in_callback[0] += spent
    name = threading.current_thread().name
    _gc_threads[name] = _gc_threads.get(name, 0.0) + spent
    if generation != 2:
        return
    _totals["gc_full"] += 1
    _totals["gc_full_s"] += spent
    _totals["gc_full_max_ms"] = max(_totals["gc_full_max_ms"], spent * 1000.0)


def main() -> None:
    """Measure the loop's callbacks of ``gpud ARGS``, writing the figures to the first argument at exit (and on
    SIGUSR2; SIGUSR1 starts afresh)."""
    out = sys.argv.pop(1)
    # The callbacks are timed through asyncio's handles, which uvloop's loop (the controller's default) does not use.
    os.environ["GPUD_EVENT_LOOP"] = "asyncio"
    asyncio.events.Handle._run = _timed  # type: ignore[method-assign]
    signal.signal(signal.SIGUSR1, lambda *_: _reset())
    signal.signal(signal.SIGUSR2, lambda *_: _write_once(out))
    atexit.register(_write_once, out)
    gc.callbacks.append(_collecting)
    from gpud.cli.gpud_main import main as gpud
    sys.argv[0] = "gpud"
    sys.exit(gpud())


if __name__ == "__main__":
    main()
