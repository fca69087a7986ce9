"""Side-by-side timing of this checkout's scheduling core against another checkout's.

The two cores run the big workload of bench/scheduler_cycle.py at the same
time, one process pinned to each of two CPUs, and swap CPUs every round: on a
machine whose speed drifts from one minute to the next (a shared VM), the
ratio of two runs made together is steadier than either figure alone.
    python bench/compare_cores.py OTHER_CHECKOUT [--rounds 6] [--quick]
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import shutil
import statistics
import subprocess
import sys

HERE = pathlib.Path(__file__).resolve().parent.parent

# Run in a fresh interpreter per checkout, with that checkout first on sys.path: CPU seconds of a
# cycle from a fresh snapshot, and the median of three warm cycles after a warm-up one.
RUN_ONE = r"""
import gc, json, random, statistics, sys, time
root, quick = sys.argv[1], sys.argv[2] == "1"
sys.path[:0] = [root, root + "/bench"]
import gpud
assert gpud.__file__.startswith(root), f"imported {gpud.__file__}, not the checkout at {root}"
from scheduler_cycle import big_cluster, timed_warm
from gpud.core import Scheduler
from gpud.plugins import make_plugin_manager
snapshot, policy = big_cluster(1, *((100, 600, 10_000) if quick else (1000, 6000, 100_000)))
gc.collect()
start = time.process_time()
scheduler = Scheduler(snapshot, policy, make_plugin_manager())
scheduler.cycle()
fresh = time.process_time() - start
rng, warm = random.Random(8), []
for cycle in range(4):
    gc.collect()
    start = time.process_time()
    timed_warm(scheduler, rng, cycle, 100)
    warm.append(time.process_time() - start)
print(json.dumps({"fresh": fresh, "warm": statistics.median(warm[1:])}))
"""


def run_round(checkouts: list[pathlib.Path], cpus: list[int], quick: bool) -> list[dict]:
    """Both checkouts at once, the i-th on CPU ``cpus[i]`` when it can be pinned; their figures in order."""
    taskset = shutil.which("taskset")
    procs = []
    for checkout, cpu in zip(checkouts, cpus):
        argv = [sys.executable, "-c", RUN_ONE, str(checkout), "1" if quick else "0"]
        procs.append(subprocess.Popen(([taskset, "-c", str(cpu)] if taskset else []) + argv, cwd="/",
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    figures = []
    for checkout, proc in zip(checkouts, procs):
        out, err = proc.communicate()
        if proc.returncode:
            raise SystemExit(f"the core of {checkout} failed:\n{err}")
        figures.append(json.loads(out))
    return figures


def main(argv: list[str] | None = None) -> None:
    """Run the rounds and print each checkout's figures and the per-round ratios (other / this)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("other", type=pathlib.Path, help="another checkout of gpud (e.g. a git worktree)")
    parser.add_argument("--rounds", type=int, default=6, help="rounds, CPUs swapped each round (default 6)")
    parser.add_argument("--quick", action="store_true", help="100 nodes, 600 running tasks, 10,000 pending")
    args = parser.parse_args(argv)
    other = args.other.resolve()
    if not (other / "gpud" / "core").is_dir():
        raise SystemExit(f"{other} is not a gpud checkout (no gpud/core)")
    if len(os.sched_getaffinity(0)) < 2:
        print("only one CPU: the two runs share it", file=sys.stderr)
    cpus = sorted(os.sched_getaffinity(0))[:2] * (1 if len(os.sched_getaffinity(0)) >= 2 else 2)
    results: dict[pathlib.Path, list[dict]] = {other: [], HERE: []}
    for n in range(args.rounds):
        order = [other, HERE] if n % 2 == 0 else [HERE, other]
        for checkout, figures in zip(order, run_round(order, cpus, args.quick)):
            results[checkout].append(figures)
    for name, checkout in (("other", other), ("this", HERE)):
        for kind in ("fresh", "warm"):
            values = ", ".join(f"{r[kind]:.3f}" for r in results[checkout])
            print(f"{name:<6}{kind:<7}CPU s per cycle: {values}  ({checkout})")
    for kind in ("fresh", "warm"):
        ratios = [a[kind] / b[kind] for a, b in zip(results[other], results[HERE])]
        print(f"{kind:<6} other/this per round: {', '.join(f'{r:.2f}' for r in ratios)}; "
              f"median {statistics.median(ratios):.2f}x")


if __name__ == "__main__":
    main()
