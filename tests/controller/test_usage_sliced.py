"""Charging a slice of jobs at a time, as a property: tasks that start and stop while a charge is under way
(between its slices, or while it writes) are charged exactly what they held, once, even when the charge is
cancelled half way (the controller stopping); what the usage views show meanwhile is exactly what was held
so far.

The charge turns the loop after every job (a slice of no time) and after adding each stopped task's stretch, so
every step can fall between two slices.
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
from waiting import loop_turn

POLICY = Policy(projects={"a": Project("a"), "b": Project("b")}, usage_half_life_s=0.0)
STEPS = st.lists(st.one_of(
    st.tuples(st.just("start"), st.sampled_from([0.5, 1.0, 2.0]), st.sampled_from(["a", "b"])),
    st.tuples(st.just("stop"), st.integers(0, 20)),
    # A stop the node tells of late: the task ended this many seconds ago (not before it started).
    st.tuples(st.just("stop late"), st.integers(0, 20), st.floats(0.0, 50.0)),
    st.tuples(st.just("advance"), st.floats(0.0, 100.0)),
    st.tuples(st.just("charge"),),
    st.tuples(st.just("cancel"),),
    st.tuples(st.just("turn"), st.integers(1, 4))), max_size=60)


def project_gpu_seconds(rows: dict) -> float:
    return sum(amount[0] for (level, _, _), amount in rows.items() if level == "project")


def start(running: list[tuple[Job, TaskRun]], gpus: float, project: str, now: float) -> None:
    job = Job(id=str(len(running)), user="u", project=project, workdir="/", gpus=gpus)
    placement = TaskPlacement("n1", (0,), gpus) if gpus < 1 else TaskPlacement("n1", tuple(range(int(gpus))))
    job.runs = [TaskRun(placement=placement, since=now)]
    running.append((job, job.runs[0]))


@settings(max_examples=examples(80), deadline=None)
@given(st.integers(0, 12), STEPS)
# A task the charge has counted stops, then the charge is cancelled: what it counted of that task is still owed.
# A task the charge has counted stops while the stopped tasks' stretches are added: charged once.
@example(2, [("advance", 10.0), ("stop", 0), ("charge",), ("turn", 3), ("advance", 5.0), ("stop", 0),
             ("advance", 3.0)])
@example(2, [("advance", 10.0), ("charge",), ("turn", 1), ("advance", 5.0), ("stop", 0), ("cancel",), ("advance", 3.0)])
# Charged up to now, then told that a task ended 4 s ago: those 4 s come back.
@example(1, [("advance", 10.0), ("charge",), ("turn", 3), ("advance", 1.0), ("stop late", 0, 4.0)])
def test_tasks_that_stop_or_start_during_a_charge_are_charged_once(first, steps):
    with tempfile.TemporaryDirectory() as tmp:
        SQLiteStore(Path(tmp)).close()
        executor = ThreadPoolExecutor(1)
        store = UsageStore(str(Path(tmp) / "gpud.sqlite"))
        clock = [1_700_000_000.0]
        running: list[tuple[Job, TaskRun]] = []
        charger = Charger(store, executor, lambda: POLICY, lambda: [job for job, _ in running],
                          lambda node: "default", clock=lambda: clock[0], slice_s=0.0, tails_per_slice=1)
        charger.load()
        for _ in range(first):  # so that the first charges have slices between which to turn
            start(running, 1.0, "a", clock[0])

        async def scenario() -> float:
            held = 0.0
            charging: list[asyncio.Future] = []
            for step in steps:
                if step[0] == "start":
                    start(running, step[1], step[2], clock[0])
                elif step[0] in ("stop", "stop late") and running:
                    job, run = running.pop(step[1] % len(running))
                    assert run.since is not None
                    ended = max(run.since, clock[0] - step[2]) if step[0] == "stop late" else clock[0]
                    charger.run_ended(job, run, ended)
                    held += job.gpus * (ended - run.since)
                    run.since = None
                elif step[0] == "advance":
                    clock[0] += step[1]
                elif step[0] == "charge" and all(c.done() for c in charging):
                    charging.append(asyncio.ensure_future(charger.charge()))
                elif step[0] == "cancel" and charging and not charging[-1].done():
                    charging[-1].cancel()
                    await asyncio.gather(charging.pop(), return_exceptions=True)
                elif step[0] == "turn":
                    for _ in range(step[1]):
                        await loop_turn()
                shown = project_gpu_seconds(charger.amounts(clock[0]))
                holding = held + sum(job.gpus * (clock[0] - run.since) for job, run in running)
                assert abs(shown - holding) <= 1e-6, (shown, holding)
            await asyncio.gather(*charging)
            await charger.charge()
            return held + sum(job.gpus * (clock[0] - run.since) for job, run in running)

        try:
            held = asyncio.run(scenario())
            reading = UsageStore(str(Path(tmp) / "gpud.sqlite"))
            stored = project_gpu_seconds(reading.load()[0])
            reading.close()
        finally:
            executor.shutdown()
            store.close()
    assert abs(stored - held) <= 1e-6, (stored, held)
