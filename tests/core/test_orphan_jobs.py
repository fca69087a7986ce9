"""Jobs of a project the policy no longer has (after a reload): running ones keep what they hold, pending
ones wait, and nothing they hold is given to another job."""

from __future__ import annotations

import dataclasses

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis_budget import examples

from gpud.core import Scheduler, schedule
from gpud.model import JobSpec, NodeSpec, Snapshot, TaskPlacement, TaskRequest
from gpud.policy import Department, Policy, Project, Resources
from gpud.plugins import make_plugin_manager
from test_properties import PM, assert_not_overcommitted, cases, run_cycles
from test_warm_scheduler import books, fresh_state
from gpud.reasons import pending_texts


SETTINGS = settings(max_examples=examples(250), deadline=None, suppress_health_check=[HealthCheck.too_slow])


@st.composite
def reloaded(draw):
    """A case whose policy lost one of the projects its jobs are in."""
    case = draw(cases())
    projects = sorted({job.project for job in case.snapshot.jobs})
    if not projects:
        return case, None
    gone = draw(st.sampled_from(projects))
    policy = dataclasses.replace(case.policy, projects={k: v for k, v in case.policy.projects.items() if k != gone})
    return dataclasses.replace(case, policy=policy), gone


@SETTINGS
@given(reloaded())
def test_jobs_of_a_removed_project_keep_their_gpus_and_start_nothing(data):
    case, gone = data
    before = {job.id: job.placements for job in case.snapshot.jobs if job.project == gone}
    for _, plan, after in run_cycles(case, case.cycles):
        assert_not_overcommitted(after)
        assert not [b for b in plan.binds if b.job in before], "a job of a removed project started"
        assert not [e for e in plan.evictions if e.job in before], "a job of a removed project was stopped"
        for job_id in before:
            if any(p is None for p in before[job_id]):
                assert "not in the policy" in pending_texts(plan)[job_id]
    assert {job.id: job.placements for job in after.jobs if job.id in before} == before


@SETTINGS
@given(reloaded())
def test_when_they_end_what_they_held_is_free_again(data):
    case, gone = data
    scheduler = Scheduler(case.snapshot, case.policy, PM)
    scheduler.cycle()
    for job in case.snapshot.jobs:
        if job.project == gone:
            scheduler.finish(job.id)
    scheduler.cycle()
    assert books(scheduler.state) == books(fresh_state(scheduler, case))


def test_a_running_job_of_a_removed_project_is_not_double_booked():
    node = NodeSpec("n1", gpus=1)
    running = JobSpec("old", "gone", TaskRequest(1), submitted=0.5, started=1.0, placements=(TaskPlacement("n1", (0,)),))
    waiting = JobSpec("new", "p1", TaskRequest(1), submitted=2.0, placements=(None,))
    policy = Policy(departments={"d": Department("d")},
                    projects={"p1": Project("p1", quota={"default": Resources(gpu=1)}, department="d")})
    plan = schedule(Snapshot((node,), (running, waiting), 10.0), policy, make_plugin_manager())
    assert plan.binds == ()
    assert "project p1" in pending_texts(plan)["new"] or "GPU" in pending_texts(plan)["new"]


def test_consolidation_moves_no_job_of_a_removed_project():
    nodes = (NodeSpec("a", gpus=2), NodeSpec("b", gpus=2))
    orphan = JobSpec("old", "gone", TaskRequest(1), submitted=0.0, started=0.0, placements=(TaskPlacement("a", (0,)),))
    mine = JobSpec("mine", "p1", TaskRequest(1), submitted=0.0, started=0.0, placements=(TaskPlacement("b", (0,)),))
    big = JobSpec("big", "p1", TaskRequest(2), submitted=1.0, placements=(None,), seq=1)
    policy = Policy(departments={"d": Department("d")}, min_runtime_s=0.0,
                    projects={"p1": Project("p1", quota={"default": Resources(gpu=4)}, department="d")})
    plan = schedule(Snapshot(nodes, (orphan, mine, big), 10.0), policy, make_plugin_manager())
    assert "old" not in {b.job for b in plan.binds} | {e.job for e in plan.evictions}
    assert [(b.job, b.placement.node) for b in plan.binds if b.job == "big"] == [("big", "b")]
