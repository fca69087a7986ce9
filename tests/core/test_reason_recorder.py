"""Why a job waits has one owner, the cycle's ReasonRecorder: which reason wins, and in whose terms.

The property runs random small clusters of every job shape (single tasks,
gangs, elastic gangs, fractions, memory slices, CPU-only, departments)
through real cycles: a job that waits with every task is told its blocker in
its own terms, whichever smaller job of its queue the failure memory learnt
it from. The other tests record through a real session and read back what
the plan would say, one precedence rule each.
"""

from __future__ import annotations

import dataclasses
from typing import Callable
from unittest import mock

from hypothesis import given
from hypothesis import strategies as st

from gpud.core import Scheduler
from gpud.core.blockers import EVICTED, FRAGMENTED_RULE, GANG, LIMIT, NODE_SIZE, NOT_CONSIDERED, SHORTAGE
from gpud.core.recorder import ReasonRecorder, in_own_terms, restate_learnt
from gpud.core.session import Session
from gpud.core.shapes import Failure
from gpud.core.queues import QueueState
from gpud.model import Blocker, Evicted, JobSpec, NodeSpec, Resources, Snapshot, TaskPlacement, TaskRequest
from gpud.policy import Department, Policy, Project
from gpud.reasons import pending_texts

from test_properties import PM, SETTINGS, TOL, assert_plans_unchanged_with, cases, python_core_only, run_cycles

OWN_TERMS = (SHORTAGE, FRAGMENTED_RULE, GANG, NODE_SIZE)


def close(a: Resources, b: Resources) -> bool:
    return abs(a.gpu - b.gpu) <= TOL and abs(a.cpu - b.cpu) <= TOL and abs(a.memory - b.memory) <= TOL


@SETTINGS
@given(cases())
def test_a_waiting_job_is_told_its_blocker_in_its_own_terms(case):
    for before, plan, after in run_cycles(case, case.cycles):
        state = Scheduler(before, case.policy, PM).state  # the sizes the cycle saw, for each job's need
        ran_before = {job.id for job in before.jobs if job.running_tasks}
        for job in after.jobs:
            if job.running_tasks or job.id in ran_before or job.project not in case.policy.projects:
                continue  # a job that runs some tasks is told why the others wait
            blocker = plan.pending[job.id].blocker
            assert blocker is not None, job.id
            if blocker.rule not in OWN_TERMS:
                continue
            tasks = max(job.gang_minimum, 1)
            if blocker.rule != SHORTAGE:
                assert blocker.request == job.request, f"{job.id} is told of {blocker.request}: {blocker}"
                assert blocker.tasks == tasks, f"{job.id} is told of {blocker.tasks} tasks, needs {tasks}: {blocker}"
            if blocker.rule != NODE_SIZE:
                need = state.need(job, tasks)
                assert close(blocker.need, need), f"{job.id} is told it needs {blocker.need}, needs {need}: {blocker}"


@SETTINGS
@given(cases())
def test_a_job_stopped_by_an_eviction_is_told_why_it_was_evicted(case):
    for _, plan, after in run_cycles(case, case.cycles):
        still = {job.id: job for job in after.jobs if job.running_tasks < job.tasks}
        for eviction in plan.evictions:
            if eviction.moved or eviction.job not in still:
                continue
            blocker = plan.pending[eviction.job].blocker
            assert blocker is not None and blocker.rule == EVICTED, f"{eviction.job} evicted, told {blocker}"
            assert blocker.evicted == eviction.why


def spared_at_once(recorder: ReasonRecorder, job: JobSpec, queue: QueueState, tasks: int, failure: Failure) -> None:
    """``ReasonRecorder.spared`` without the wait: the blocker restated for the job as it is recorded."""
    recorder.overrule(job.id, queue, restate_learnt(recorder.state, job, tasks, failure.blocker, None))


def made_at_once(recorder: ReasonRecorder, job_id: str, queue: QueueState, explain: Callable[[], Blocker]) -> None:
    """``ReasonRecorder.overrule_when_read`` without the wait: the blocker made as it is recorded."""
    recorder.overrule(job_id, queue, explain())


def learnt_at_once(recorder: ReasonRecorder, job: JobSpec, queue: QueueState, tasks: int, failure: Failure) -> None:
    """``ReasonRecorder.learnt`` without the wait: the blocker said in the job's terms as it is recorded."""
    recorder.waits(job.id, queue, in_own_terms(recorder.state, job, tasks, failure.blocker))


# Every reason the core leaves to be worked out when read, worked out at once instead.
AT_ONCE = {"spared": spared_at_once, "overrule_when_read": made_at_once, "learnt": learnt_at_once}


@python_core_only
@SETTINGS
@given(cases())
def test_a_spared_jobs_reason_restated_when_read_is_the_one_restated_at_once(case):
    # Preemption passes over thousands of jobs a failure of their queue covers; each is told the
    # failure's blocker in its own terms only when its reason is read.
    assert_plans_unchanged_with(case, ReasonRecorder, "spared", spared_at_once)


@python_core_only
@SETTINGS
@given(cases())
def test_a_reason_learnt_from_a_smaller_job_said_when_read_is_the_one_said_at_once(case):
    # Allocation passes over a job an earlier failure covers; it is told that failure in its own terms
    # only when its reason is read, with the free room of the moment it was passed over.
    assert_plans_unchanged_with(case, ReasonRecorder, "learnt", learnt_at_once)


@python_core_only
@SETTINGS
@given(cases())
def test_a_preemptors_reason_made_when_read_is_the_one_made_at_once(case):
    # A preemption its queue's fair share stopped leaves the blocker saying so to be made when read.
    assert_plans_unchanged_with(case, ReasonRecorder, "overrule_when_read", made_at_once)


def larger_twins(draw, jobs: tuple[JobSpec, ...], prefix: str, seq: int, submitted: float) -> list[JobSpec]:
    """Pending jobs each like one of ``jobs`` (project, request kind, CPUs, memory) but as large or
    larger and at a priority as low or lower: the failure memory passes them over for the earlier
    job's failure, to be told it in their own terms."""
    twins = []
    for i, job in enumerate(draw(st.lists(st.sampled_from(jobs), max_size=5)) if jobs else []):
        request = job.request
        if request.uses_gpu and request.gpu_memory_gib is None and not request.is_shared:
            request = dataclasses.replace(request, gpus=request.gpus + draw(st.integers(0, 2)))
        twins.append(JobSpec(f"{prefix}{i}", job.project, request, tasks=job.tasks + draw(st.integers(0, 1)),
                             priority=draw(st.sampled_from([p for p in (50, 75, 100, 125) if p <= job.priority])),
                             submitted=submitted, seq=seq + i))
    return twins


@st.composite
def churned(draw):
    """A case whose running jobs have the lowest priority, with larger twins of its jobs waiting too,
    and steps of running jobs finished and larger twins submitted before each warm cycle."""
    case = draw(cases())
    # The running jobs at the lowest priority, so that most waiting jobs may preempt.
    jobs = tuple(dataclasses.replace(job, priority=50) if job.running_tasks else job for job in case.snapshot.jobs)
    jobs += tuple(larger_twins(draw, jobs, "w", 100, 0.0))
    case = dataclasses.replace(case, snapshot=dataclasses.replace(case.snapshot, jobs=jobs))
    steps = [(larger_twins(draw, case.snapshot.jobs, f"s{step}-", 1000 + 10 * step, float(step)),
              draw(st.integers(0, 3))) for step in range(draw(st.integers(1, 4)))]
    return case, steps


@python_core_only
@SETTINGS
@given(churned())
def test_a_warm_schedulers_spared_reasons_read_later_are_the_ones_restated_at_once(data):
    # Two warm schedulers see the same churn, one saying every reason at once. The lazy plans are read only
    # after the next cycle ran, as a caller may read them while the scheduler moves on.
    case, steps = data
    lazy, eager = Scheduler(case.snapshot, case.policy, PM), Scheduler(case.snapshot, case.policy, PM)
    plans = [lazy.cycle()]
    with mock.patch.multiple(ReasonRecorder, **AT_ONCE):
        texts = [dict(pending_texts(eager.cycle()))]
    for new, finishing in steps:
        running = [j.id for j in lazy.jobs() if j.is_running][:finishing]
        for scheduler in (lazy, eager):
            for job_id in running:
                scheduler.finish(job_id)
            for job in new:
                scheduler.submit(job)
        plans.append(lazy.cycle())
        with mock.patch.multiple(ReasonRecorder, **AT_ONCE):
            eager_plan = eager.cycle()
        assert (plans[-1].binds, plans[-1].evictions, plans[-1].queues) == (
            eager_plan.binds, eager_plan.evictions, eager_plan.queues)
        texts.append(dict(pending_texts(eager_plan)))
    known = lazy.state.jobs  # a plan reads a job's group through the backlog: jobs that left are not compared
    for plan, then in zip(plans, texts):
        assert {j: r for j, r in pending_texts(plan).items() if j in known} == {
            j: r for j, r in then.items() if j in known}


def test_a_plan_read_after_jobs_of_a_group_left_still_tells_the_others_why():
    """A plan read later, as a caller may while the scheduler moves on: the reason of a group passed over
    with its queue is worked out from a job still known, never from one that finished since (which would
    leave the others "not considered")."""
    policy = Policy(departments={"d": Department("d")}, projects={"p1": Project("p1", department="d")})
    nodes = tuple(NodeSpec(f"n{i}", gpus=1) for i in range(3))
    jobs = tuple(JobSpec(f"j{i}", "p1", TaskRequest(gpus=0.5), tasks=3, seq=i) for i in range(5))
    scheduler = Scheduler(Snapshot(nodes, jobs, 0.0), policy, PM)
    eager = Scheduler(Snapshot(nodes, jobs, 0.0), policy, PM)
    first = scheduler.cycle()
    told_at_once = dict(pending_texts(eager.cycle()))
    assert "waiting for GPUs" in told_at_once["j4"]
    for _ in range(2):  # the two running jobs end, two waiting ones start; then again
        for job_id in [j.id for j in scheduler.jobs() if j.is_running]:
            scheduler.finish(job_id)
        scheduler.cycle()
    assert dict(pending_texts(first))["j4"] == told_at_once["j4"]


def covered_by_another_project() -> tuple[Snapshot, Policy]:
    """One node of 4 GPUs, 3 of them held for good; p2 (holding nothing, so walked first) waits for 2 GPUs,
    p1 for 3: allocation learns from p2's job that no room is left, and passes over p1's for it."""
    policy = Policy(departments={"d": Department("d")},
                    projects={"p1": Project("p1", department="d"), "p2": Project("p2", department="d")})
    busy = JobSpec("busy", "p1", TaskRequest(gpus=3), priority=100, started=0.0,  # never evicted
                   placements=(TaskPlacement("n0", (0, 1, 2)),))
    small = JobSpec("small", "p2", TaskRequest(gpus=2), seq=1)
    large = JobSpec("large", "p1", TaskRequest(gpus=3), seq=2)
    return Snapshot((NodeSpec("n0", gpus=4),), (busy, small, large), 10.0), policy


def test_a_job_another_projects_failure_covers_is_told_its_own_need_when_read_later():
    snapshot, policy = covered_by_another_project()
    scheduler = Scheduler(snapshot, policy, PM)
    plan = scheduler.cycle()
    scheduler.finish("busy")
    scheduler.cycle()  # the room is free now: the reason read after says what it was when passed over
    blocker = plan.pending["large"].blocker
    assert blocker is not None and blocker.rule == SHORTAGE and blocker.need.gpu == 3  # its own need, not 2
    assert blocker.free == 1


@python_core_only
def test_a_reason_learnt_from_another_projects_failure_is_the_one_said_at_once():
    snapshot, policy = covered_by_another_project()
    learnt: list[str] = []
    recorded = ReasonRecorder.learnt

    def noted(recorder: ReasonRecorder, job: JobSpec, *args: object) -> None:
        learnt.append(job.id)
        recorded(recorder, job, *args)  # type: ignore[arg-type]

    lazy = Scheduler(snapshot, policy, PM)
    with mock.patch.object(ReasonRecorder, "learnt", noted):
        plan = lazy.cycle()
    assert learnt == ["large"]
    with mock.patch.multiple(ReasonRecorder, **AT_ONCE):
        told_at_once = dict(pending_texts(Scheduler(snapshot, policy, PM).cycle()))
    lazy.finish("busy")
    lazy.cycle()
    assert dict(pending_texts(plan)) == told_at_once


# --- precedence, recorded through a real session -------------------------------------------------

def session_of(jobs: tuple[JobSpec, ...]) -> tuple[Scheduler, Session]:
    """A scheduler over one node of 4 GPUs and project p1 (p9 is unknown), and a session begun on it."""
    policy = Policy(departments={"d": Department("d")}, projects={"p1": Project("p1", department="d")})
    scheduler = Scheduler(Snapshot((NodeSpec("n1", gpus=4),), jobs, 10.0), policy, PM)
    scheduler.state.begin_cycle(10.0)
    return scheduler, Session(scheduler.state)


RUNNING = JobSpec("run", "p1", TaskRequest(2), started=0.0, placements=(TaskPlacement("n1", (0, 1)),))
WAITING = JobSpec("wait", "p1", TaskRequest(4))


def shortage(need: float) -> Blocker:
    return Blocker(SHORTAGE, "default", resource="gpu", free=2.0, need=Resources(need))


def test_a_later_action_replaces_a_reason_only_with_a_blocker_of_its_own():
    scheduler, session = session_of((RUNNING, WAITING))
    reasons, queue = session.reasons, scheduler.state.project_queue(WAITING)
    reasons.waits("wait", queue, shortage(4.0))
    reasons.overrule("wait", queue, None)
    assert reasons.of("wait", None) == (queue, shortage(4.0))
    limit = Blocker(LIMIT, "default", level="project", name="p1")
    reasons.overrule("wait", queue, limit)
    assert reasons.of("wait", None) == (queue, limit)


def test_an_evicted_job_is_told_why_until_the_eviction_is_rolled_back():
    scheduler, session = session_of((RUNNING, WAITING))
    reasons, queue = session.reasons, scheduler.state.project_queue(RUNNING)
    reasons.waits("run", queue, shortage(2.0))
    why = Evicted("preempt", "wait", "p1", 75, "run", 50)
    stmt = session.statement()
    stmt.evict(scheduler.state.jobs["run"], 0, "preempt", why, "wait")
    assert reasons.of("run", None) == (None, Blocker(EVICTED, evicted=why))
    stmt.rollback()
    assert reasons.of("run", None) == (queue, shortage(2.0))


def test_a_job_of_an_unknown_project_is_told_so_whatever_else_was_recorded():
    stray = JobSpec("stray", "p9", TaskRequest(1))
    _, session = session_of((stray,))
    session.reasons.waits("stray", None, shortage(1.0))
    queue, blocker = session.reasons.of("stray", None)
    assert queue is None and blocker is not None and blocker.rule == "unknown_project" and blocker.name == "p9"


def test_an_elastic_job_started_with_some_tasks_is_told_why_the_others_wait_and_then_nothing():
    elastic = JobSpec("el", "p1", TaskRequest(0.5), tasks=3, min_tasks=1)
    scheduler, session = session_of((RUNNING, elastic))
    state, reasons = scheduler.state, session.reasons
    queue = state.project_queue(elastic)
    reasons.waits("el", queue, shortage(1.5))
    stmt = session.statement()
    stmt.bind(state.jobs["el"], 0, TaskPlacement("n1", (2,), 0.5))
    reasons.started(state.jobs["el"], queue)
    _, blocker = reasons.of("el", None)
    assert blocker is not None and (blocker.runs, blocker.of_tasks) == (1, 3)
    stmt.bind(state.jobs["el"], 1, TaskPlacement("n1", (2,), 0.5))
    stmt.bind(state.jobs["el"], 2, TaskPlacement("n1", (3,), 0.5))
    reasons.started(state.jobs["el"], queue)
    assert reasons.of("el", None) == (None, Blocker(NOT_CONSIDERED))  # it waits no more: no action's reason


def test_a_jobs_own_reason_comes_before_its_groups():
    scheduler, session = session_of((RUNNING, WAITING))
    state, reasons = scheduler.state, session.reasons
    queue = state.project_queue(WAITING)
    group = state.backlog.as_of_now()["wait"]
    reasons.group_learnt(group, WAITING, queue, 1, shortage(1.0))
    _, told = reasons.of("wait", group)
    assert told is not None and told.need == Resources(4.0, 1.0, 1.0)  # restated: it needs 4 GPUs, not 1
    limit = Blocker(LIMIT, "default", level="project", name="p1")
    reasons.waits("wait", queue, limit)
    assert reasons.of("wait", group) == (queue, limit)


def test_a_task_larger_than_any_node_is_told_of_its_own_request_not_a_smaller_jobs():
    from gpud.core import schedule
    from gpud.reasons import pending_texts

    policy = Policy(departments={"d": Department("d")}, projects={"p1": Project("p1", department="d")})
    small = JobSpec("small", "p1", TaskRequest(3, cpus=0.0), submitted=1.0, seq=1)
    large = JobSpec("large", "p1", TaskRequest(3, cpus=3.0), tasks=2, submitted=2.0, seq=2)
    plan = schedule(Snapshot((NodeSpec("n1", gpus=2),), (small, large), 10.0), policy, PM)
    blocker = plan.pending["large"].blocker
    assert blocker is not None and blocker.rule == NODE_SIZE
    assert (blocker.request, blocker.tasks) == (large.request, 2)
    assert "3 CPU" in pending_texts(plan)["large"], pending_texts(plan)["large"]
