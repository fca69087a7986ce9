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
what a caller then asks of the daemon is left out).

From SIGUSR1 on, a probe on the loop also asks to wake every LAG_EVERY_S
and notes each wake-up late by LAG_STALL_S or more (a request arriving
then waited as long): how late, and what the process did meanwhile, as CPU
time of the loop's thread, of each other thread (the scheduling cycle's,
the store's), of the collector's passes by generation, the longest loop
callback, and the whole process. Wall time the process did not spend on a
CPU is the machine's other load; the cycle's thread's CPU beside a loop
thread that ran little is the loop waiting for the GIL.
"""

from __future__ import annotations

import asyncio.events
import atexit
import gc
import heapq
import json
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
# Since the probe's last wake-up: the longest loop callback, and the callbacks' CPU time by what ran them.
_window: dict = {"callback_s": 0.0, "callback": "", "kinds": {}}
_lag: dict = {"armed": False, "stalls": [], "ticks": 0, "late_max_ms": 0.0, "over_stall": 0}


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
             "longest_ms": [[round(spent * 1000.0, 1), what] for spent, _, what in sorted(_longest, reverse=True)],
             "lag": {"ticks": _lag["ticks"], "late_max_ms": round(_lag["late_max_ms"], 1),
                     "stalls_over_100ms": _lag["over_stall"], "longest_stalls": _lag["stalls"]}}
    with open(path, "w", encoding="utf-8") as f:
        json.dump(found, f, indent=1)


def _write_once(path: str) -> None:
    if not _totals.get("written"):
        _write(path)
        _totals["written"] = 1


def _reset() -> None:
    _longest.clear()
    _totals.update({"callbacks": 0, "cpu_s": 0.0, "over_10ms": 0, "over_100ms": 0, "gc_full": 0,
                    "gc_full_max_ms": 0.0, "gc_full_s": 0.0})
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
