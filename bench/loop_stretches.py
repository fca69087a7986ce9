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
"""

from __future__ import annotations

import asyncio.events
import atexit
import gc
import heapq
import json
import signal
import sys
import time

KEPT = 20
_run = asyncio.events.Handle._run
_longest: list[tuple[float, int, str]] = []
_totals = {"callbacks": 0, "cpu_s": 0.0, "over_10ms": 0, "over_100ms": 0, "gc_full": 0, "gc_full_max_ms": 0.0,
           "gc_full_s": 0.0}
_gc_began = [0.0]


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
    coro = _coro_of(handle)
    before = _deepest(coro) if coro is not None else ""
    began = time.thread_time()
    try:
        _run(handle)
    finally:
        spent = time.thread_time() - began
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
            if len(_longest) < KEPT:
                heapq.heappush(_longest, entry)
            elif entry > _longest[0]:
                heapq.heapreplace(_longest, entry)


def _write(path: str) -> None:
    found = {**{k: v for k, v in _totals.items() if k != "written"}, "cpu_s": round(_totals["cpu_s"], 3),
             "gc_full_s": round(_totals["gc_full_s"], 3), "gc_full_max_ms": round(_totals["gc_full_max_ms"], 1),
             "longest_ms": [[round(spent * 1000.0, 1), what] for spent, _, what in sorted(_longest, reverse=True)]}
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


def _collecting(phase: str, info: dict) -> None:
    """Time the collector's full passes (generation 2), which stop whichever thread triggers them."""
    if info.get("generation") != 2:
        return
    if phase == "start":
        _gc_began[0] = time.thread_time()
        return
    spent = time.thread_time() - _gc_began[0]
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
