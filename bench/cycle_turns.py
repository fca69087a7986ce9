"""How long a scheduling cycle run in a thread holds the main thread, with the core's turns and without.

The controller runs a long cycle in its cycle thread so that its event loop
keeps answering; a compiled core hands the interpreter's lock over only where
it calls interpreted code, so without turns (gpud.core.turns) the loop waits
for the cycle. This runs the big workload of bench/scheduler_cycle.py (1,000
nodes, 6,000 running tasks, 100,000 pending; --size as there) in a thread,
a fresh cycle (the scheduler built and run once) and a warm one (100
submissions and 100 completions, then a cycle), each with the controller's
turn (gpud.controller.cycle_turns) and without, while the main thread sleeps
1 ms at a time under the controller's switch interval. It prints the gaps
between the main thread's ticks (median, p99, max, in ms) and the cycle's CPU
seconds. The garbage collector is held off meanwhile: its full passes hold
every thread whatever the core does (the controller keeps them rare,
gpud/controller/heap.py). Run it with the compiled core installed, from outside the source
tree (PYTHONSAFEPATH=1); it says which core it ran.

    python bench/cycle_turns.py [--size quick|big|huge] [--repeat 3] [--json] [--instructions] [--loop]

With --loop, warm cycles also run in a thread from an asyncio loop, as the
controller runs them, with the plain turn and with the loop's thread first
(gpud.controller.cycle_turns.LoopFirst), alternated: on an idle loop (what
standing aside costs a cycle) and on a loop busy with turns of 5 ms of CPU
one after the other (how much longer than its CPU time each turn takes,
and the cycle's time). Medians over --repeat.

With --instructions, a fresh cycle runs once with the turn and once without
under valgrind's callgrind, which counts the instructions it executes: what
the turns cost, the same at every run.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import pathlib
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Callable

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
import scheduler_cycle as sc  # noqa: E402  (the workloads, beside this file)

from gpud.controller import cycle_turns  # noqa: E402
from gpud.controller.service import GIL_SWITCH_INTERVAL_S  # noqa: E402
from gpud.core import COMPILED, Scheduler  # noqa: E402
from gpud.plugins import make_plugin_manager  # noqa: E402

TICK_S = 0.001
LOOP_TURN_S = 0.005  # --loop: the CPU time of each turn of a busy loop


def ticks_while(work: Callable[[], None]) -> tuple[list[float], float]:
    """Run ``work`` in a thread while this thread ticks every TICK_S: the gaps between ticks (s), and the
    work's CPU seconds (its thread's)."""
    done = threading.Event()
    cpu = [0.0]
    gc.collect()
    gc.disable()  # a full pass holds every thread whatever the core does (gpud.controller.heap keeps them rare)

    def run() -> None:
        began = time.thread_time()
        work()
        cpu[0] = time.thread_time() - began
        done.set()

    gaps: list[float] = []
    thread = threading.Thread(target=run)
    last = time.perf_counter()
    thread.start()
    while not done.is_set():
        time.sleep(TICK_S)
        now = time.perf_counter()
        gaps.append(now - last)
        last = now
    thread.join()
    gc.enable()
    return gaps, cpu[0]


def figures(gaps: list[float], cpu: float) -> dict:
    """The gaps' median, p99 and max in ms, with the cycle's CPU seconds."""
    ordered = sorted(gaps)
    return {"ticks": len(ordered), "median_ms": round(statistics.median(ordered) * 1000, 2),
            "p99_ms": round(ordered[int(len(ordered) * 0.99)] * 1000, 1), "max_ms": round(ordered[-1] * 1000, 1),
            "cycle_cpu_s": round(cpu, 3)}


def fresh(snapshot, policy, pm, turn: Callable[[], None] | None) -> dict:
    """A scheduler built from the snapshot and its first cycle, in a thread."""
    def work() -> None:
        Scheduler(snapshot, policy, pm, turn, cycle_turns.TURN_EVERY).cycle(snapshot.now, turn)
    return figures(*ticks_while(work))


def warm_work(scheduler: Scheduler, rng: random.Random, n: int,
              turn: Callable[[], None] | None) -> Callable[[], None]:
    """100 completions and 100 submissions taken in, then a cycle 10 s later: the work a thread runs (as the
    controller's cycle thread does both)."""
    jobs = scheduler.jobs()
    done = rng.sample([j.id for j in jobs if j.is_running], 100)
    names = sorted({j.project for j in jobs})
    seq = max(j.seq for j in jobs) + 1
    now = scheduler.state.now + 10.0
    new = [sc.pending_job(rng, f"t{n}-{i}", rng.choice(names), seq + i, now - 10 + i * 0.01) for i in range(100)]

    def work() -> None:
        for job_id in done:
            scheduler.finish(job_id)
        for job in new:
            scheduler.submit(job)
        scheduler.cycle(now, turn)
    return work


def warm(scheduler: Scheduler, rng: random.Random, n: int, turn: Callable[[], None] | None) -> dict:
    """A warm cycle (``warm_work``) in a thread, the main thread ticking meanwhile."""
    return figures(*ticks_while(warm_work(scheduler, rng, n, turn)))


def on_a_loop(scheduler: Scheduler, rng: random.Random, n: int, loop_first: bool, busy: bool) -> dict:
    """A warm cycle run in a thread from an asyncio loop, as the controller runs it, with the plain turn or the
    loop's thread first (cycle_turns.LoopFirst); with ``busy`` the loop meanwhile runs turns of LOOP_TURN_S of its
    thread's CPU one after the other, as a loop busy with a fleet's messages does. The cycle's wall seconds, and
    the loop's turns' wall time per CPU time (median and p99: 1.0 is a loop that runs at full speed), and how long
    the cycle's thread stood aside."""
    first = cycle_turns.LoopFirst()
    work = warm_work(scheduler, rng, n, first.give if loop_first else cycle_turns.give_turn)
    stretches: list[float] = []

    async def run() -> float:
        loop = asyncio.get_running_loop()
        began = time.perf_counter()
        first.start()
        cycle = loop.run_in_executor(executor, work)
        while busy and not cycle.done():
            wall, cpu = time.perf_counter(), time.thread_time()
            while time.thread_time() - cpu < LOOP_TURN_S:
                pass
            stretches.append((time.perf_counter() - wall) / (time.thread_time() - cpu))
            await asyncio.sleep(0)
        await cycle
        first.stop()
        return time.perf_counter() - began

    with ThreadPoolExecutor(1) as executor:
        seconds = asyncio.run(run())
    result: dict = {"cycle_s": round(seconds, 4), "stood_aside_s": round(first.aside, 4)}
    if stretches:
        stretches.sort()
        result.update({"loop_turns": len(stretches), "stretch_median": round(statistics.median(stretches), 2),
                        "stretch_p99": round(stretches[int(len(stretches) * 0.99)], 2)})
    return result


# One fresh cycle, counted from the exec that runs it: argv is this folder, the size, and "with" or "without".
RUN_COUNTED = """
import json, sys
sys.path.insert(0, sys.argv[1])
import scheduler_cycle as sc
from gpud.controller import cycle_turns
from gpud.core import schedule
from gpud.plugins import make_plugin_manager
snapshot, policy = sc.big_cluster(1, *json.loads(sys.argv[2]))
pm = make_plugin_manager()
turn = cycle_turns.give_turn if sys.argv[3] == "with" else None
exec("schedule(snapshot, policy, pm, turn, cycle_turns.TURN_EVERY)")
"""


def count_instructions(size: str) -> dict[str, int]:
    """Instructions of one fresh cycle with the turn and without, counted by callgrind, both runs at once."""
    valgrind = shutil.which("valgrind")
    if valgrind is None:
        raise SystemExit("--instructions needs valgrind (Debian: apt-get install valgrind)")
    counts: dict[str, int] = {}
    with tempfile.TemporaryDirectory() as scratch:
        procs = []
        for label in ("without", "with"):
            out = pathlib.Path(scratch) / f"{label}.out"
            argv = [valgrind, "--tool=callgrind", "--collect-atstart=no", "--toggle-collect=builtin_exec*",
                    f"--callgrind-out-file={out}", sys.executable, "-c", RUN_COUNTED,
                    str(pathlib.Path(__file__).resolve().parent), json.dumps(sc.SIZES[size]), label]
            env = {**os.environ, "PYTHONHASHSEED": "0"}  # sets and dicts of strings in one order every run
            procs.append((label, out, subprocess.Popen(argv, cwd="/", env=env, text=True,
                                                       stdout=subprocess.PIPE, stderr=subprocess.PIPE)))
        for label, out, proc in procs:
            _, err = proc.communicate()
            totals = [line for line in out.read_text().splitlines() if line.startswith("totals:")] \
                if out.exists() else []
            if proc.returncode or not totals:
                raise SystemExit(f"the cycle failed under valgrind ({label} turns):\n{err[-2000:]}")
            counts[label] = int(totals[0].split()[1])
    return counts


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size", choices=sc.SIZES, default="big", help="the workload (default big)")
    parser.add_argument("--repeat", type=int, default=3, help="runs of each kind (default 3)")
    parser.add_argument("--seed", type=int, default=1, help="random seed of the workload (default 1)")
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    parser.add_argument("--instructions", action="store_true",
                        help="count a fresh cycle's instructions under valgrind, with the turn and without")
    parser.add_argument("--loop", action="store_true",
                        help="also run warm cycles from an asyncio loop, idle or busy, with the plain turn and with "
                             "the loop's thread first (cycle_turns.LoopFirst), alternated")
    args = parser.parse_args(argv)
    if args.instructions:
        counts = count_instructions(args.size)
        extra = counts["with"] / counts["without"] - 1
        print(f"{'compiled' if COMPILED else 'Python'} core, {args.size} workload, a fresh cycle: "
              f"{counts['without'] / 1e6:,.1f} M instructions without turns, {counts['with'] / 1e6:,.1f} M with "
              f"a turn every {cycle_turns.TURN_EVERY} steps ({extra:+.2%})")
        return
    sys.setswitchinterval(GIL_SWITCH_INTERVAL_S)  # as the controller sets it
    nodes, running, pending = sc.SIZES[args.size]
    snapshot, policy = sc.big_cluster(args.seed, nodes, running, pending)
    pm = make_plugin_manager()
    give = cycle_turns.give_turn
    out: dict = {"compiled": COMPILED, "size": args.size, "switch_interval_s": GIL_SWITCH_INTERVAL_S,
                 "turn_every": cycle_turns.TURN_EVERY}
    for kind in ("fresh", "warm"):
        for label, turn in (("without", None), ("with", give)):
            out[f"{kind}_{label}_turns"] = []
    for _ in range(args.repeat):
        for label, turn in (("without", None), ("with", give)):
            out[f"fresh_{label}_turns"].append(fresh(snapshot, policy, pm, turn))
    scheduler = Scheduler(snapshot, policy, pm)
    scheduler.cycle()
    rng = random.Random(args.seed + 7)
    n = 0
    for _ in range(args.repeat):
        for label, turn in (("without", None), ("with", give)):
            out[f"warm_{label}_turns"].append(warm(scheduler, rng, n, turn))
            n += 1
    if args.loop:
        for _ in range(args.repeat):
            for busy in (False, True):
                for label, loop_first in (("plain", False), ("loop_first", True)):
                    out.setdefault(f"loop_{'busy' if busy else 'idle'}_{label}", []).append(
                        on_a_loop(scheduler, rng, n, loop_first, busy))
                    n += 1
    if args.json:
        print(json.dumps(out, indent=2))
        return
    print(f"{'compiled' if COMPILED else 'Python'} core, {args.size} workload, switch interval "
          f"{GIL_SWITCH_INTERVAL_S * 1000:g} ms, a turn every {cycle_turns.TURN_EVERY} steps; main thread's "
          f"tick gaps (ms) while a cycle runs in a thread:")
    for key, runs in out.items():
        if isinstance(runs, list) and key.startswith("loop_"):
            cycles = statistics.median(run["cycle_s"] for run in runs) * 1000
            line = f"  {key:22} cycle median {cycles:7.1f} ms"
            if "stretch_median" in runs[0]:
                line += (f"   loop turn wall / CPU: median {statistics.median(r['stretch_median'] for r in runs):.2f}"
                         f", p99 {statistics.median(r['stretch_p99'] for r in runs):.2f}")
            print(line)
        elif isinstance(runs, list):
            for run in runs:
                print(f"  {key:22} median {run['median_ms']:6.2f}  p99 {run['p99_ms']:7.1f}  max {run['max_ms']:7.1f}"
                      f"   cycle CPU {run['cycle_cpu_s']:.3f} s")


if __name__ == "__main__":
    main()
