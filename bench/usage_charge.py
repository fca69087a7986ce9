"""What one usage charge costs, and what reading the decayed usage costs a scheduling cycle.

Builds N running jobs of 1 to 8 GPUs (each a user in one of P projects),
charges them into a real SQLite store (synchronous=FULL) in a temporary
directory R times, and prints the median and worst time of a charge (its
work on the event loop and its write), the longest the charge holds the
event loop between two of its turns (CPU time: the charge counts the
running jobs a slice at a time), and ``decayed_usage()``, the one call a
cycle makes.
    python bench/usage_charge.py [--jobs 10000] [--projects 50] [--rounds 20]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from gpud.accounting.charger import Charger
from gpud.jobs import Job, TaskRun
from gpud.model import TaskPlacement
from gpud.policy import Policy, Project
from gpud.store.sqlite import SQLiteStore
from gpud.store.usage import UsageStore


def running_jobs(count: int, projects: int, now: float) -> list[Job]:
    """``count`` jobs holding 1 to 8 whole GPUs on nodes of 8, started a minute ago."""
    jobs = []
    for i in range(count):
        gpus = 1 + i % 8
        job = Job(id=str(i + 1), user=f"u{i % 500}", project=f"p{i % projects}", workdir="/", gpus=gpus,
                  state="RUNNING", started=now - 60)
        job.runs = [TaskRun(placement=TaskPlacement(f"n{i}", tuple(range(gpus))), state="running", since=now - 60)]
        jobs.append(job)
    return jobs


async def measure(args: argparse.Namespace) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        SQLiteStore(Path(tmp)).close()   # the jobs table the usage store sits beside
        store = UsageStore(str(Path(tmp) / "gpud.sqlite"))
        policy = Policy(projects={f"p{i}": Project(f"p{i}") for i in range(args.projects)})
        jobs = running_jobs(args.jobs, args.projects, time.time())
        executor = ThreadPoolExecutor(1)
        charger = Charger(store, executor, lambda: policy, lambda: jobs, lambda node: "default")
        charges, loop_parts, holds, reads = [], [], [], []
        for _ in range(args.rounds):
            began = time.perf_counter()
            charger.pending(time.time())       # what running jobs owe, counted in one go
            loop_parts.append(time.perf_counter() - began)
            began = time.perf_counter()
            charging = asyncio.ensure_future(charger.charge())
            longest = 0.0
            while not charging.done():         # the loop's turns while the charge runs: how long each held it
                turn = time.thread_time()
                await asyncio.sleep(0)
                longest = max(longest, time.thread_time() - turn)
            await charging
            charges.append(time.perf_counter() - began)
            holds.append(longest)
            began = time.perf_counter()
            for _ in range(1000):
                charger.decayed_usage()
            reads.append((time.perf_counter() - began) / 1000)
        executor.shutdown()
        store.close()
    ms = lambda values: f"median {statistics.median(values) * 1e3:.2f} ms, worst {max(values) * 1e3:.2f} ms"
    print(f"{args.jobs} running jobs, {len(charger.rows)} usage rows")
    print(f"charge (decay, add, write, fsync): {ms(charges)}")
    print(f"what running jobs owe, counted in one go: {ms(loop_parts)}")
    print(f"  the longest a charge holds the event loop (CPU): {ms(holds)}")
    print(f"decayed_usage() per scheduling cycle: {statistics.median(reads) * 1e6:.3f} us")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--jobs", type=int, default=10_000)
    parser.add_argument("--projects", type=int, default=50)
    parser.add_argument("--rounds", type=int, default=20)
    asyncio.run(measure(parser.parse_args()))


if __name__ == "__main__":
    main()
