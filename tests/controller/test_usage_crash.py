"""Charging with crashes, as a property: over any run of starts, stops, charges and controller crashes, the
stored usage is what the tasks held, less at most the last stretches of tasks that stopped since the charge
before a crash; never more, and exactly that with no crash.

A crash drops the charger's memory and reads the real SQLite store back, as a restarted controller does.
"""

from __future__ import annotations

import asyncio
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from hypothesis import example, given, settings
from hypothesis import strategies as st
from hypothesis_budget import examples

from gpud.accounting.charger import Charger
from gpud.jobs import Job, TaskRun
from gpud.model import TaskPlacement
from gpud.policy import Policy, Project
from gpud.store.sqlite import SQLiteStore
from gpud.store.usage import UsageStore

POLICY = Policy(projects={"a": Project("a"), "b": Project("b")}, usage_half_life_s=0.0)
STEPS = st.lists(st.one_of(
    st.tuples(st.just("start"), st.sampled_from([0.25, 0.5, 1.0, 2.0, 8.0]), st.sampled_from(["a", "b"])),
    st.tuples(st.just("stop"), st.integers(0, 20)),
    st.tuples(st.just("advance"), st.floats(0.0, 100.0)),
    st.tuples(st.just("charge"),),
    st.tuples(st.just("crash"),)), max_size=40)


def project_gpu_seconds(rows: dict) -> float:
    return sum(amount[0] for (level, _, _), amount in rows.items() if level == "project")


@settings(max_examples=examples(60), deadline=None)
@given(STEPS)
@example([("start", 0.25, "a"), ("advance", 1.0), ("crash",)])  # a crash before the first charge ever
def test_usage_is_what_tasks_held_less_at_most_what_a_crash_drops(steps):
    with tempfile.TemporaryDirectory() as tmp:
        SQLiteStore(Path(tmp)).close()
        executor = ThreadPoolExecutor(1)
        clock = [1_700_000_000.0]
        running: list[tuple[Job, TaskRun]] = []
        stores: list[UsageStore] = []

        def new_charger() -> Charger:
            stores.append(UsageStore(str(Path(tmp) / "gpud.sqlite")))
            charger = Charger(stores[-1], executor, lambda: POLICY, lambda: [job for job, _ in running],
                              lambda node: "default", clock=lambda: clock[0])
            charger.load()
            return charger

        charger = new_charger()
        held = dropped = 0.0
        for step in steps:
            if step[0] == "start":
                job = Job(id=str(len(running)), user="u", project=step[2], workdir="/", gpus=step[1])
                job.runs = [TaskRun(placement=TaskPlacement("n1", (0,), min(step[1], 1.0)) if step[1] < 1 else
                                    TaskPlacement("n1", tuple(range(int(step[1])))), since=clock[0])]
                running.append((job, job.runs[0]))
            elif step[0] == "stop" and running:
                job, run = running.pop(step[1] % len(running))
                charger.run_ended(job, run, clock[0])
                held += job.gpus * (clock[0] - run.since)
                run.since = None
            elif step[0] == "advance":
                clock[0] += step[1]
            elif step[0] == "charge":
                asyncio.run(charger.charge())
            elif step[0] == "crash":
                dropped += sum(amount[0] for (level, _, _), amount in charger.tails if level == "project")
                charger = new_charger()
        asyncio.run(charger.charge())
        held += sum(job.gpus * (clock[0] - run.since) for job, run in running)
        stored = project_gpu_seconds(UsageStore(str(Path(tmp) / "gpud.sqlite")).load()[0])
        executor.shutdown()
        for store in stores:
            store.close()
    assert held - dropped - 1e-6 <= stored <= held + 1e-6
    if "crash" not in [s[0] for s in steps]:
        assert abs(stored - held) <= 1e-6
