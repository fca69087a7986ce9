"""/metrics counts a fleet's active jobs in slices: every job once, the event loop free in between."""

import asyncio

from gpud.controller.metrics_view import TALLY_STEP, job_tallies
from gpud.jobs import Job, TaskRun
from gpud.lifecycle import PENDING, RUNNING
from gpud.model import TaskPlacement


def jobs(count: int) -> list[Job]:
    made = []
    for i in range(count):
        job = Job(id=str(i), user="u", project=f"p{i % 3}", workdir="/tmp", command=["true"], gpus=1, tasks=2,
                  pool="big" if i % 5 == 0 else None)
        if i % 4 == 0:  # running: one task on a whole GPU, one on half of another
            job.state = RUNNING
            job.runs = [TaskRun(placement=TaskPlacement("n1", (0,))), TaskRun(placement=TaskPlacement("n1", (1,), 0.5))]
        made.append(job)
    return made


def test_every_job_counts_once_and_running_ones_count_their_gpus():
    every = jobs(40 * TALLY_STEP + 7)
    by_state, allocated = asyncio.run(job_tallies(every, "default"))
    assert sum(by_state.values()) == len(every)
    for project in ("p0", "p1", "p2"):
        mine = [j for j in every if j.project == project]
        assert by_state[(RUNNING, project)] == sum(1 for j in mine if j.state == RUNNING)
        assert by_state[(PENDING, project)] == sum(1 for j in mine if j.state == PENDING)
        for pool in ("big", "default"):
            held = sum(1.5 for j in mine if j.state == RUNNING and (j.pool or "default") == pool)
            assert allocated.get((project, pool), 0.0) == held


def test_the_loop_runs_other_work_between_slices():
    every = jobs(60 * TALLY_STEP)
    turns = []

    async def main() -> None:
        async def ticker() -> None:
            while True:
                turns.append(None)
                await asyncio.sleep(0)
        ticking = asyncio.ensure_future(ticker())
        await asyncio.sleep(0)
        before = len(turns)
        await job_tallies(every, "default")
        ticking.cancel()
        assert len(turns) - before >= 2, "the walk held the loop from the first job to the last"
    asyncio.run(main())
