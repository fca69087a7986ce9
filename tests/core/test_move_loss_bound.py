"""Consolidation never throws away more work than its bound: a move is voluntary.

With ``victim_order = "least_lost_work"``, the moves that clear a node for a pending job lose at most
the policy's ``max_move_lost_hours`` hours of that job's GPUs (at least one GPU), counted as
evictions count lost work: the GPUs a moved job holds times the time since its last checkpoint, or
its start (docs/scheduling.md, Consolidate). Moves within the bound are made as without it;
``youngest_first`` moves as before, with no bound.
"""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis_budget import examples

from gpud.core import schedule
from gpud.model import JobSpec, NodeSpec, Snapshot, TaskPlacement, TaskRequest
from gpud.policy import LEAST_LOST_WORK, YOUNGEST_FIRST, Policy

from test_moves_by_lost_work import PM, TOL, _policy, scattered_cases
from test_properties import POOL
from test_victims_by_lost_work import lost

HOUR = 3600.0
LATER = 4 * HOUR  # the clock of the examples below: old jobs there ran hours


def bound(policy: Policy, job: JobSpec) -> float:
    """The most GPU-seconds moves for ``job`` may lose (the formula of docs/scheduling.md)."""
    return policy.max_move_lost_hours * HOUR * max(1.0, job.request.gpus * job.tasks)


def lost_by_moves(snapshot: Snapshot, plan) -> float:
    """The GPU-seconds lost by the jobs the plan moves, each job once."""
    jobs = {job.id: job for job in snapshot.jobs}
    moved = dict.fromkeys(e.job for e in plan.evictions if e.rule == "consolidate")
    return sum(lost(jobs[job_id], snapshot.now) for job_id in moved)


@st.composite
def bounded_cases(draw) -> tuple[Policy, Snapshot]:
    """scattered_cases (every job shape, jobs that ran up to 1,000 s and checkpointed or not) under a
    bound drawn from none at all to more than any job there could lose."""
    policy, snapshot = draw(scattered_cases())
    hours = draw(st.sampled_from([0.0, 0.02, 0.05, 0.1, 0.2, 0.5]))
    return dataclasses.replace(policy, max_move_lost_hours=hours), snapshot


@settings(max_examples=examples(300), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(bounded_cases())
def test_moves_never_lose_more_than_the_bound(case):
    policy, snapshot = case
    plan = schedule(snapshot, policy, PM)
    want = next(job for job in snapshot.jobs if job.id == "want")
    assert lost_by_moves(snapshot, plan) <= bound(policy, want) + TOL


@settings(max_examples=examples(300), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(bounded_cases())
def test_moves_within_the_bound_are_made_as_without_it(case):
    policy, snapshot = case
    unbounded = schedule(snapshot, dataclasses.replace(policy, max_move_lost_hours=1e9), PM)
    want = next(job for job in snapshot.jobs if job.id == "want")
    if lost_by_moves(snapshot, unbounded) <= bound(policy, want):
        assert schedule(snapshot, policy, PM) == unbounded


def _share_job(job_id: str, node: str, gpu: int, share: float, started: float, checkpointed: float | None,
               priority: int = 50) -> JobSpec:
    return JobSpec(id=job_id, project="p", request=TaskRequest(gpus=share), priority=priority, submitted=started,
                   started=started, placements=(TaskPlacement(node, (gpu,), share),), checkpointed=checkpointed)


def _old_jobs_in_the_way(gpus_wanted: float) -> Snapshot:
    """n1 (2 GPUs): a job on 0.75 of GPU 0 that ran 4 hours without a checkpoint (3 GPU-hours lost if it
    moves), and one on 0.5 of GPU 1 that ran 3.97 hours without one (about 2 GPU-hours); n2 (1 GPU): 0.25
    held by a job that never moves. A job of ``gpus_wanted`` whole GPUs waits: moving the first job to n2
    makes room on n1."""
    old = _share_job("old", "n1", 0, 0.75, 0.0, None)
    other = _share_job("other", "n1", 1, 0.5, 100.0, None)
    pinned = _share_job("pinned", "n2", 0, 0.25, 0.0, None, priority=100)
    want = JobSpec(id="want", project="p", request=TaskRequest(gpus=gpus_wanted), priority=50,
                   submitted=LATER - 1.0)
    nodes = (NodeSpec("n1", gpus=2, pool=POOL), NodeSpec("n2", gpus=1, pool=POOL))
    return Snapshot(nodes, (old, other, pinned, want), LATER)


def _moves(snapshot: Snapshot, policy: Policy) -> list[tuple[str, bool]]:
    plan = schedule(snapshot, policy, PM)
    return [(e.job, e.moved) for e in plan.evictions if e.rule == "consolidate"]


def test_a_move_that_would_lose_three_gpu_hours_waits_for_a_one_gpu_job():
    snapshot = _old_jobs_in_the_way(1.0)
    assert _moves(snapshot, _policy(LEAST_LOST_WORK, 300.0)) == []
    plan = schedule(snapshot, _policy(LEAST_LOST_WORK, 300.0), PM)
    assert "want" not in {b.job for b in plan.binds}


def test_a_larger_bound_or_youngest_first_moves_it():
    snapshot = _old_jobs_in_the_way(1.0)
    raised = dataclasses.replace(_policy(LEAST_LOST_WORK, 300.0), max_move_lost_hours=3.5)
    assert _moves(snapshot, raised) == [("old", True)]
    assert _moves(snapshot, _policy(YOUNGEST_FIRST, 300.0)) == [("old", True)]


def test_the_bound_grows_with_the_gpus_of_the_job_to_start():
    # Two whole GPUs wanted on n1, where "old" alone is in the way: the bound is 2 x 2 GPU-hours, and
    # moving "old" to n2 loses 3; with a bound of 1 hour a GPU (2 GPU-hours) the job waits.
    snapshot = _old_jobs_in_the_way(2.0)
    alone = Snapshot(snapshot.nodes, tuple(j for j in snapshot.jobs if j.id != "other"), snapshot.now)
    assert _moves(alone, _policy(LEAST_LOST_WORK, 300.0)) == [("old", True)]
    assert _moves(alone, dataclasses.replace(_policy(LEAST_LOST_WORK, 300.0), max_move_lost_hours=1.0)) == []


def test_a_job_that_just_checkpointed_moves_within_the_bound():
    snapshot = _old_jobs_in_the_way(1.0)
    saved = Snapshot(snapshot.nodes, tuple(dataclasses.replace(j, checkpointed=LATER - 60.0) if j.id == "old"
                                           else j for j in snapshot.jobs), snapshot.now)
    assert _moves(saved, _policy(LEAST_LOST_WORK, 300.0)) == [("old", True)]


def test_a_task_taken_off_and_placed_back_where_it_was_is_no_move_under_the_bound():
    """n3 holds two half-GPU jobs on its two GPUs and a quarter one. To make a whole GPU there, its tasks
    come off in order: the half on GPU 1 first, then the half on GPU 0; the first goes back where it was.
    Only the second moves (500 GPU-s lost, within the 720 of a 0.2-hour bound), as it does without one."""
    def share(job_id: str, node: str, gpu: int, gpus: float, seq: int, started: float = 0.0) -> JobSpec:
        return JobSpec(id=job_id, project="p", request=TaskRequest(gpus=gpus), priority=50, submitted=started,
                       started=started, placements=(TaskPlacement(node, (gpu,), gpus),), seq=seq)
    jobs = (share("j0", "n1", 0, 0.25, 0), share("j1", "n1", 0, 0.25, 1, started=701.0),
            share("j2", "n2", 0, 0.5, 2), share("j3", "n2", 1, 0.75, 3),
            share("moves", "n3", 0, 0.5, 4), share("quarter", "n3", 1, 0.25, 5), share("stays", "n3", 1, 0.5, 6))
    want = JobSpec(id="want", project="p", request=TaskRequest(gpus=1.0), priority=50, submitted=999.0, seq=7)
    nodes = (NodeSpec("n1", gpus=1, cpus=13.0, memory_gib=32.0, pool=POOL),
             NodeSpec("n2", gpus=2, cpus=8.0, memory_gib=33.0, pool=POOL),
             NodeSpec("n3", gpus=2, cpus=8.0, memory_gib=32.0, pool=POOL))
    snapshot = Snapshot(nodes, (*jobs, want), 1000.0)
    policy = dataclasses.replace(_policy(LEAST_LOST_WORK, 300.0), max_move_lost_hours=0.2)
    plan = schedule(snapshot, policy, PM)
    assert [(e.job, e.rule) for e in plan.evictions] == [("moves", "consolidate")]
    assert [(b.job, b.placement.node) for b in plan.binds] == [("moves", "n2"), ("want", "n3")]
    assert lost_by_moves(snapshot, plan) == pytest.approx(500.0)
    assert plan == schedule(snapshot, dataclasses.replace(policy, max_move_lost_hours=1e9), PM)
