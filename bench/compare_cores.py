"""Side-by-side timing of this checkout's scheduling core against another checkout's.

The two cores run the big workload of bench/scheduler_cycle.py at the same
time, one process pinned to each of two CPUs, and swap CPUs every round: on a
machine whose speed drifts from one minute to the next (a shared VM), the
ratio of two runs made together is steadier than either figure alone.

With --instructions, each core runs once under valgrind's callgrind, which
counts the instructions the cycles execute: the same count at every run, so
a change of 1% shows (valgrind must be installed; the big workload takes
about ten minutes under it, --quick about one).
    python bench/compare_cores.py OTHER_CHECKOUT [--rounds 6] [--quick | --size huge] [--users N]
        [--instructions]

--size picks the big workload's size as bench/scheduler_cycle.py does (huge: 2,000 nodes, 300,000
pending jobs); --users N gives every job one of N users per project, so the user order runs.
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
import tempfile

HERE = pathlib.Path(__file__).resolve().parent.parent
# (nodes, running tasks, pending jobs) at each --size, as bench/scheduler_cycle.py has them.
SIZES = {"quick": (100, 600, 10_000), "big": (1000, 6000, 100_000), "huge": (2000, 12_000, 300_000)}

# Run in a fresh interpreter per checkout, with that checkout first on sys.path: CPU seconds of a
# cycle from a fresh snapshot, and the median of three warm cycles after a warm-up one.
RUN_ONE = r"""
import dataclasses, gc, inspect, json, random, statistics, sys, time
root, size, users = sys.argv[1], json.loads(sys.argv[2]), int(sys.argv[3])
sys.path[:0] = [root, root + "/bench"]
import gpud
assert gpud.__file__.startswith(root), f"imported {gpud.__file__}, not the checkout at {root}"
from scheduler_cycle import big_cluster, timed_warm
from gpud.core import Scheduler
from gpud.model import JobSpec
from gpud.plugins import make_plugin_manager
snapshot, policy = big_cluster(1, *size)
if users and "user" in JobSpec.__dataclass_fields__:  # a checkout that knows users: the jobs get some
    pick = random.Random(5)
    snapshot = dataclasses.replace(snapshot, jobs=tuple(dataclasses.replace(job, user=f"u{pick.randrange(users)}")
                                                        for job in snapshot.jobs))
gc.collect()
start = time.process_time()
scheduler = Scheduler(snapshot, policy, make_plugin_manager())
scheduler.cycle()
fresh = time.process_time() - start
# Submissions get users too where the checkout's timed_warm gives them.
warm_users = {"users": users} if users and "users" in inspect.signature(timed_warm).parameters else {}
rng, warm = random.Random(8), []
for cycle in range(4):  # timed_warm's own CPU seconds: the submissions and completions and the cycle, not
    warm.append(timed_warm(scheduler, rng, cycle, 100, **warm_users)["cpu_s"])  # the making of them
print(json.dumps({"fresh": fresh, "warm": statistics.median(warm[1:])}))
"""


# The same workload, for callgrind: only what runs inside exec() is counted (--toggle-collect), so the
# workload's own making is left out. One phase per run: the fresh cycle, or three warm cycles after one.
RUN_COUNTED = r"""
import gc, json, random, sys
root, size, phase = sys.argv[1], json.loads(sys.argv[2]), sys.argv[3]
sys.path[:0] = [root, root + "/bench"]
import gpud
assert gpud.__file__.startswith(root), f"imported {gpud.__file__}, not the checkout at {root}"
from scheduler_cycle import big_cluster, pending_job
from gpud.core import Scheduler
from gpud.plugins import make_plugin_manager
gc.disable()
snapshot, policy = big_cluster(1, *size)
pm = make_plugin_manager()
if phase == "fresh":
    exec("Scheduler(snapshot, policy, pm).cycle()")
else:
    scheduler, rng = Scheduler(snapshot, policy, pm), random.Random(8)
    scheduler.cycle()
    for cycle in range(4):
        jobs = scheduler.jobs()
        done = rng.sample([j.id for j in jobs if j.is_running], 100)
        names, seq = sorted({j.project for j in jobs}), max(j.seq for j in jobs) + 1
        now = scheduler.state.now + 10.0
        for job_id in done:
            scheduler.finish(job_id)
        for i in range(100):
            scheduler.submit(pending_job(rng, f"s{cycle}-{i}", rng.choice(names), seq + i, now - 10 + i * 0.01))
        if cycle:
            exec("scheduler.cycle(now)")
        else:
            scheduler.cycle(now)
"""


def count_instructions(checkouts: list[pathlib.Path], size: str) -> dict[tuple[pathlib.Path, str], int]:
    """Instructions of each checkout's fresh cycle and three warm cycles, counted by callgrind, two runs at once."""
    valgrind = shutil.which("valgrind")
    if valgrind is None:
        raise SystemExit("--instructions needs valgrind (Debian: apt-get install valgrind)")
    runs = [(checkout, phase) for checkout in checkouts for phase in ("fresh", "warm")]
    counts: dict[tuple[pathlib.Path, str], int] = {}
    with tempfile.TemporaryDirectory() as scratch:
        for pair in (runs[i:i + 2] for i in range(0, len(runs), 2)):
            procs = []
            for checkout, phase in pair:
                out = pathlib.Path(scratch) / f"{len(counts) + len(procs)}.out"
                argv = [valgrind, "--tool=callgrind", "--collect-atstart=no", "--toggle-collect=builtin_exec*",
                        f"--callgrind-out-file={out}", sys.executable, "-c", RUN_COUNTED, str(checkout),
                        json.dumps(SIZES[size]), phase]
                env = {**os.environ, "PYTHONHASHSEED": "0"}  # sets and dicts of strings in one order every run
                procs.append((checkout, phase, out, subprocess.Popen(argv, cwd="/", env=env, text=True,
                                                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE)))
            for checkout, phase, out, proc in procs:
                _, err = proc.communicate()
                totals = [line for line in out.read_text().splitlines() if line.startswith("totals:")] \
                    if out.exists() else []
                if proc.returncode or not totals:
                    raise SystemExit(f"the core of {checkout} failed under valgrind ({phase}):\n{err[-2000:]}")
                counts[(checkout, phase)] = int(totals[0].split()[1])
    return counts


def run_round(checkouts: list[pathlib.Path], cpus: list[int], size: str, users: int = 0) -> list[dict]:
    """Both checkouts at once, the i-th on CPU ``cpus[i]`` when it can be pinned; their figures in order.

    ``users``: the jobs of a checkout whose jobs have users get one of that many each.
    """
    taskset = shutil.which("taskset")
    procs = []
    for checkout, cpu in zip(checkouts, cpus):
        argv = [sys.executable, "-c", RUN_ONE, str(checkout), json.dumps(SIZES[size]), str(users)]
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
    parser.add_argument("--quick", action="store_true", help="100 nodes, 600 running tasks, 10,000 pending "
                        "(--size quick)")
    parser.add_argument("--size", choices=SIZES, default="big", help="the workload's size: quick, big (1,000 "
                        "nodes, 100,000 pending; the default) or huge (2,000 nodes, 300,000 pending)")
    parser.add_argument("--users", type=int, default=0,
                        help="give each job one of N users, where the checkout's jobs have users (default 0)")
    parser.add_argument("--instructions", action="store_true",
                        help="count instructions under valgrind instead of timing (one run, the same every time)")
    args = parser.parse_args(argv)
    size = "quick" if args.quick else args.size
    other = args.other.resolve()
    if not (other / "gpud" / "core").is_dir():
        raise SystemExit(f"{other} is not a gpud checkout (no gpud/core)")
    if args.instructions:
        counts = count_instructions([other, HERE], size)
        for kind, what in (("fresh", "the fresh cycle"), ("warm", "three warm cycles")):
            mine, theirs = counts[(HERE, kind)], counts[(other, kind)]
            print(f"{kind:<6} instructions of {what}: other {theirs / 1e6:,.1f} M, this {mine / 1e6:,.1f} M; "
                  f"other/this {theirs / mine:.3f}x")
        return
    if len(os.sched_getaffinity(0)) < 2:
        print("only one CPU: the two runs share it", file=sys.stderr)
    cpus = sorted(os.sched_getaffinity(0))[:2] * (1 if len(os.sched_getaffinity(0)) >= 2 else 2)
    results: dict[pathlib.Path, list[dict]] = {other: [], HERE: []}
    for n in range(args.rounds):
        order = [other, HERE] if n % 2 == 0 else [HERE, other]
        for checkout, figures in zip(order, run_round(order, cpus, size, args.users)):
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
