"""The warm scheduler (gpud.core.Scheduler): jobs submitted and finished between cycles.

The controller keeps one Scheduler alive and feeds it submissions and completions; its books
(what each queue holds and asks for, what each node has free, which jobs wait) must always
equal what a scheduler built afresh from the same jobs would have, and its plans must keep
every invariant the snapshot path keeps.
"""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpud.core import Scheduler, schedule
from gpud.core.cover import QueueCovers
from gpud.core.memo import Memo
from gpud.core.shapes import ShapeIndex
from gpud.core.state import ClusterState
from gpud.model import JobSpec, NodeSpec, Resources, Snapshot, TaskPlacement, TaskRequest
from gpud.policy import Department, Limits, NodePool, Policy, Project
from gpud.plugins import make_plugin_manager
from gpud.reasons import pending_texts
from test_properties import PM, SETTINGS, Case, assert_not_overcommitted, cases, requests

from sched_helpers import scenario


def books(state: ClusterState) -> dict:
    """Everything a cycle starts from, rounded so float sums in another order compare equal."""
    def r(x: float) -> float:
        return round(x, 6)
    queues = {key: (r(q.alloc_gpu), r(q.alloc_cpu), r(q.alloc_mem), r(q.fixed_gpu))
              for key, q in state.queues.items()}
    pending = {q.name: tuple(r(x) for x in need) for q, need in state.pending_need.items()
               if any(abs(x) > 1e-9 for x in need)}
    nodes = {name: (tuple(r(f) for f in n.free_share), r(n.free_cpu), r(n.free_mem))
             for name, n in state.nodes.items()}
    waiting = sorted(state.backlog.group_of)
    user_gpus = {(queue.name, user): r(held) for queue, users in state.user_gpus.items()
                 for user, held in users.items() if abs(held) > 1e-9}
    book = state.book
    limits = None if book is None else (
        {user: r(held) for user, held in book.user_gpus.items() if abs(held) > 1e-9},
        {member: r(held) for member, held in book.member_gpus.items() if abs(held) > 1e-9},
        {user: n for user, n in book.user_running.items() if n},
        {member: n for member, n in book.member_running.items() if n},
        {project: n for project, n in book.project_running.items() if n}, sorted(book.running))
    return {"queues": queues, "pending": pending, "nodes": nodes, "waiting": waiting, "user_gpus": user_gpus,
            "limits": limits}


def fresh_state(scheduler: Scheduler, case: Case) -> ClusterState:
    snapshot = Snapshot(case.snapshot.nodes, scheduler.jobs(), scheduler.state.now)
    return ClusterState(snapshot, case.policy, PM)


USERS = ("alice", "bob", "")


@st.composite
def churned(draw):
    """A case whose jobs have users, under user limits or none, and steps of jobs submitted and finished."""
    case = draw(cases())
    jobs = tuple(dataclasses.replace(job, user=draw(st.sampled_from(USERS))) for job in case.snapshot.jobs)
    limits = Limits(gpus=draw(st.sampled_from([None, 2.0, 4.0])), running_jobs=draw(st.sampled_from([None, 1, 3])))
    case = dataclasses.replace(case, snapshot=dataclasses.replace(case.snapshot, jobs=jobs),
                               policy=dataclasses.replace(case.policy, user_limits=limits))
    steps = []
    for step in range(draw(st.integers(1, 4))):
        new = [JobSpec(id=f"s{step}-{i}", project=draw(st.sampled_from(sorted(case.policy.projects))),
                       request=draw(requests()), priority=draw(st.sampled_from([50, 75, 100])),
                       tasks=draw(st.integers(1, 2)), submitted=float(step), seq=1000 + 10 * step + i,
                       placements=(None, None), user=draw(st.sampled_from(USERS)))
               for i in range(draw(st.integers(0, 3)))]
        new = [dataclasses.replace(j, placements=(None,) * j.tasks) for j in new]
        steps.append((new, draw(st.integers(0, 3))))
    return case, steps


@SETTINGS
@given(churned())
def test_warm_books_equal_a_fresh_build_after_every_cycle(data):
    case, steps = data
    scheduler = Scheduler(case.snapshot, case.policy, PM)
    scheduler.cycle()
    for new, finishing in steps:
        running = [j.id for j in scheduler.jobs() if j.is_running][:finishing]
        for job_id in running:
            scheduler.finish(job_id)
        for job in new:
            scheduler.submit(job)
        scheduler.cycle()
        assert books(scheduler.state) == books(fresh_state(scheduler, case))
        after = Snapshot(case.snapshot.nodes, scheduler.jobs(), scheduler.state.now)
        assert_not_overcommitted(after)
        for job in after.jobs:
            running_tasks = job.running_tasks
            assert running_tasks == 0 or running_tasks >= job.gang_minimum, f"gang {job.id} broken"


@SETTINGS
@given(churned())
def test_a_plan_read_after_later_cycles_lists_the_jobs_that_waited_then(data):
    # A plan's reasons are read through the backlog as it changes (nothing is copied): read after
    # more cycles, a plan must still list the jobs that waited when it was made, for the same reasons.
    # (Reasons of jobs that have finished since are not compared: the plan reads the job itself.)
    case, steps = data
    read_at_once, read_later = Scheduler(case.snapshot, case.policy, PM), Scheduler(case.snapshot, case.policy, PM)
    seen = [dict(pending_texts(read_at_once.cycle()))]
    kept = [read_later.cycle()]
    for new, finishing in steps:
        running = [j.id for j in read_at_once.jobs() if j.is_running][:finishing]
        for scheduler in (read_at_once, read_later):
            for job_id in running:
                scheduler.finish(job_id)
            for job in new:
                scheduler.submit(job)
        seen.append(dict(pending_texts(read_at_once.cycle())))
        kept.append(read_later.cycle())
    for then, plan in zip(seen, kept):
        later = pending_texts(plan)
        assert sorted(later) == sorted(then) and len(later) == len(then)
        known = read_later.state.jobs
        assert {j: r for j, r in later.items() if j in known} == {j: r for j, r in then.items() if j in known}


@SETTINGS
@given(cases())
def test_first_warm_cycle_is_the_snapshot_schedule(case):
    # schedule() leaves its state as the cycle left it, for no cycle follows: the jobs it says wait,
    # in the same order and for the same reasons, are those a warm scheduler's books hold after it.
    warm = Scheduler(case.snapshot, case.policy, PM).cycle()
    cold = schedule(case.snapshot, case.policy, PM)
    assert warm.binds == cold.binds
    assert warm.evictions == cold.evictions
    assert list(pending_texts(warm).items()) == list(pending_texts(cold).items())


def test_a_started_job_keeps_every_field_of_its_spec():
    # The core rebuilds each job it starts or stops with its new placements; the rest of the spec
    # (selector, pool, gang minimum, order, ...) must come back exactly as submitted.
    node = NodeSpec("n1", gpus=4, labels={"rack": "r1"}, pool="fast")
    job = JobSpec("j", "p1", TaskRequest(1, cpus=2, memory_gib=3), priority=75, tasks=2, min_tasks=1,
                  submitted=5.0, placements=(None, None), node_selector={"rack": "r1"}, pool="fast", seq=42,
                  user="ada", checkpointed=4.0, time_limit=600.0, predicted_runtime=300.0)
    defaults = JobSpec("d", "p", TaskRequest(1))
    kept = [f.name for f in dataclasses.fields(JobSpec) if f.name not in ("id", "project", "request", "started")]
    assert [name for name in kept if getattr(job, name) == getattr(defaults, name)] == [], \
        "every field a job keeps is set apart from its default here"
    project = Project("p1", quota={"fast": Resources(gpu=4)}, department="d")
    policy = Policy(departments={"d": Department("d")}, projects={"p1": project}, pools={"fast": NodePool("fast")},
                    default_pool="fast")
    scheduler = Scheduler(Snapshot((node,), (job,), 10.0), policy, PM)
    plan = scheduler.cycle()
    assert len(plan.binds) == 2
    started = scheduler.job("j")
    assert started.is_running and started.started == 10.0
    assert dataclasses.replace(started, placements=job.placements, started=None) == job


def test_finished_job_frees_its_gpus_for_the_next_cycle():
    sc = scenario("""
        [[policy.projects]]
        name = "p1"
        [[nodes]]
        name = "n1"
        gpus = 2
        [[jobs]]
        name = "old"
        project = "p1"
        gpus = 2
        running_on = ["n1"]
        [[jobs]]
        name = "next"
        project = "p1"
        gpus = 2
        submitted = 100
        """)
    scheduler = Scheduler(sc.snapshot, sc.policy, PM)
    first = scheduler.cycle()
    assert first.binds == () and "next" in pending_texts(first)
    scheduler.finish("old")
    second = scheduler.cycle()
    assert [(b.job, b.placement.node, b.placement.gpu_index) for b in second.binds] == [("next", "n1", (0, 1))]
    assert "next" not in pending_texts(second)
    assert scheduler.job("next").is_running


def test_a_job_started_again_after_its_eviction_is_judged_by_its_new_start():
    # "low" is preempted, then starts again when the preemptor ends. Just restarted, it is younger
    # than the minimum run time, so the next preemptor takes "mid" instead. A victim remembered from
    # before the eviction (started long ago) would let "low" go again.
    node = NodeSpec("n1", gpus=2, cpus=8, memory_gib=64)
    ran = [JobSpec(name, "p1", TaskRequest(1, cpus=1, memory_gib=1), priority=priority, submitted=0.0,
                   started=100.0, placements=(TaskPlacement("n1", (gpu,), 1.0),), seq=gpu)
           for gpu, (name, priority) in enumerate([("mid", 50), ("low", 40)])]
    policy = Policy(departments={"d": Department("d")},
                    projects={"p1": Project("p1", quota={"default": Resources(gpu=2)}, department="d")},
                    min_runtime_s=600.0)
    scheduler = Scheduler(Snapshot((node,), tuple(ran), 10_000.0), policy, PM)
    scheduler.submit(JobSpec("urgent1", "p1", TaskRequest(1, cpus=1, memory_gib=1), priority=75,
                             submitted=9_000.0, placements=(None,), seq=10))
    first = scheduler.cycle()
    assert [(e.job, e.rule) for e in first.evictions] == [("low", "preempt")]
    scheduler.finish("urgent1")
    second = scheduler.cycle(10_010.0)
    assert [b.job for b in second.binds] == ["low"] and scheduler.job("low").started == 10_010.0
    scheduler.submit(JobSpec("urgent2", "p1", TaskRequest(1, cpus=1, memory_gib=1), priority=75,
                             submitted=10_015.0, placements=(None,), seq=11))
    third = scheduler.cycle(10_020.0)
    assert [(e.job, e.rule) for e in third.evictions] == [("mid", "preempt")]


def test_submitting_a_known_job_twice_is_refused():
    sc = scenario("""
        [[policy.projects]]
        name = "p1"
        [[nodes]]
        name = "n1"
        gpus = 1
        [[jobs]]
        name = "a"
        project = "p1"
        gpus = 1
        """)
    scheduler = Scheduler(sc.snapshot, sc.policy, PM)
    with pytest.raises(ValueError, match="already known"):
        scheduler.submit(JobSpec("a", "p1", TaskRequest(1), placements=(None,)))


def test_a_node_filter_plugin_judges_each_job_on_its_own(tmp_path):
    # The plugin keeps project "picky" off node n1. A picky job that finds no room must not make
    # the scheduler pass over a same-shaped job of another project that n1 would take.
    (tmp_path / "picky.py").write_text(
        "from gpud import hookimpl\n\n"
        "@hookimpl\n"
        "def gpud_filter_node(job, node):\n"
        "    if job.project == 'picky' and node.name == 'n1':\n"
        "        return 'picky jobs stay off n1'\n"
        "    return None\n")
    sc = scenario("""
        [[policy.projects]]
        name = "picky"
        [[policy.projects]]
        name = "easy"
        [[nodes]]
        name = "n1"
        gpus = 1
        [[jobs]]
        name = "p"
        project = "picky"
        gpus = 1
        submitted = 0
        [[jobs]]
        name = "e"
        project = "easy"
        gpus = 1
        submitted = 10
        """)
    pm = make_plugin_manager(directory=tmp_path)
    plan = schedule(sc.snapshot, sc.policy, pm)
    assert [b.job for b in plan.binds] == ["e"]
    assert "p" in pending_texts(plan)



def same_plan(first, second) -> None:
    assert first.binds == second.binds
    assert first.evictions == second.evictions
    assert dict(pending_texts(first)) == dict(pending_texts(second))
    assert first.queues == second.queues


def sorted_heads(state: ClusterState) -> dict:
    """Each queue's groups by first job, sorted afresh."""
    return {queue: sorted((group.keys[0], group.seq, group) for group in groups.values())
            for queue, groups in state.backlog.by_queue.items() if groups}


def forget_memories(state: ClusterState) -> None:
    """Drop what the state keeps up to date across cycles besides the jobs themselves: job shapes,
    shared tuples of unplaced tasks, each queue's groups in order, each queue's smallest groups, each
    group's shape number, each job's need per task and the needs shared by jobs that ask alike."""
    state.shapes = ShapeIndex(state)
    for groups in state.backlog.by_queue.values():
        for group in groups.values():
            group.sid = -1
    state.covers = QueueCovers(state)
    state._task_needs = Memo()
    state._needs_by_request = {}
    for job_id, slots in state.placements.items():
        state.placements[job_id] = list(slots)
    state.backlog.heads = sorted_heads(state)


@SETTINGS
@given(churned(), st.sampled_from([0.0, 10.0, 400.0]), st.data())
def test_what_a_warm_scheduler_remembers_never_changes_a_plan(data, step, draw):
    # Two warm schedulers see the same churn; one forgets its memories before every cycle. A
    # finished job's id may come back with another request, so a remembered shape would be stale;
    # twins of known jobs (same project, request and size) make groups of several jobs.
    case, steps = data
    kept, forgetful = Scheduler(case.snapshot, case.policy, PM), Scheduler(case.snapshot, case.policy, PM)
    same_plan(kept.cycle(), forgetful.cycle())
    for n, (new, finishing) in enumerate(steps):
        finished = [j.id for j in kept.jobs() if j.is_running][:finishing]
        again = [JobSpec(job_id, kept.job(job_id).project, draw.draw(requests()), priority=75,
                         submitted=kept.state.now, placements=(None,))
                 for job_id in finished if draw.draw(st.booleans())]
        known = [j for j in kept.jobs() if j.id not in finished]
        twins = [JobSpec(f"t{n}-{i}", j.project, j.request, priority=draw.draw(st.sampled_from([50, 75])),
                         tasks=j.tasks, submitted=draw.draw(st.sampled_from([0.0, 500.0])), seq=2000 + 10 * n + i,
                         placements=(None,) * j.tasks)
                 for i, j in enumerate(draw.draw(st.lists(st.sampled_from(known), max_size=4)) if known else [])]
        for scheduler in (kept, forgetful):
            for job_id in finished:
                scheduler.finish(job_id)
            for job in [*new, *again, *twins]:
                scheduler.submit(job)
        assert {q: h for q, h in kept.state.backlog.heads.items() if h} == sorted_heads(kept.state)
        forget_memories(forgetful.state)
        now = kept.state.now + step
        same_plan(kept.cycle(now), forgetful.cycle(now))
        # Each queue's running jobs are listed with the JobSpec the scheduler holds now, not an older one.
        assert all(kept.state.jobs[job_id] is job for running in kept.state.running.values()
                   for job_id, job in running.items())


def test_a_warm_scheduler_weighs_the_work_a_victim_would_lose_at_each_cycles_time():
    # Two preemptible jobs share a node: one GPU since t=0 and two GPUs since t=600. A job of a higher
    # priority asking for one GPU stops the one that loses the fewer GPU-seconds: at t=1000 the two-GPU
    # job (800 against 1000), at t=2000 the one-GPU job (2000 against 2800). A scheduler that made its
    # victims at t=1000, when a job too large to ever fit tried to preempt, must weigh them again at t=2000.
    policy = Policy(departments={"d": Department("d")},
                    projects={"p": Project("p", quota={"default": Resources(gpu=3)}, department="d")})
    running = (JobSpec("small", "p", TaskRequest(1), priority=50, submitted=0.0, started=0.0,
                       placements=(TaskPlacement("n1", (0,)),)),
               JobSpec("big", "p", TaskRequest(2), priority=50, submitted=600.0, started=600.0,
                       placements=(TaskPlacement("n1", (1, 2)),)))
    too_large = JobSpec("too-large", "p", TaskRequest(4), priority=75, submitted=900.0, seq=1)
    snapshot = Snapshot((NodeSpec("n1", gpus=3),), (*running, too_large), now=1000.0)
    scheduler = Scheduler(snapshot, policy, PM)
    assert not scheduler.cycle().evictions
    one = JobSpec("one", "p", TaskRequest(1), priority=75, submitted=1500.0, seq=2)
    scheduler.submit(one)
    assert [e.job for e in scheduler.cycle(2000.0).evictions] == ["small"]
    fresh = schedule(Snapshot(snapshot.nodes, (*running, too_large, one), now=2000.0), policy, PM)
    assert [e.job for e in fresh.evictions] == ["small"]


def test_consolidation_sees_nodes_in_their_order_of_free_share_after_a_job_finished():
    # A node a finished job left emptier must come first in the next cycle, though nothing was placed since.
    from gpud.core.consolidate import Consolidate
    from gpud.core.session import Session

    nodes = (NodeSpec("n1", gpus=4), NodeSpec("n2", gpus=4))
    jobs = (JobSpec("a", "p1", TaskRequest(1), started=0.0, placements=(TaskPlacement("n1", (0,)),)),
            JobSpec("b", "p1", TaskRequest(3), started=0.0, placements=(TaskPlacement("n2", (0, 1, 2)),)))
    policy = Policy(departments={"d": Department("d")}, projects={"p1": Project("p1", department="d")})
    scheduler = Scheduler(Snapshot(nodes, jobs, 10.0), policy, PM)
    scheduler.cycle()
    state = scheduler.state
    assert [n.name for n in Consolidate(Session(state)).most_free_first("default")] == ["n1", "n2"]
    scheduler.finish("b")  # n2 is now all free, n1 still runs "a"
    state.begin_cycle(20.0)
    action = Consolidate(Session(state))
    action.run()
    assert [n.name for n in action.most_free_first("default")] == ["n2", "n1"]
