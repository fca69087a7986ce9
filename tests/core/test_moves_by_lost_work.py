"""Consolidation moves weigh the work they lose: a move stops and restarts a job, as an eviction does.

With ``victim_order = "least_lost_work"`` consolidation still moves the fewest tasks, and among moves
as few it moves those that lose the fewest GPU-seconds (since their last checkpoint, or their start);
on a node its largest GPU holders could clear, a task whose job checkpointed in its current run is
tried alone too, so that no single move of a checkpointed job off the node cleared that would have
made room loses less than the moves made (nor makes room with fewer). Jobs that never checkpointed
are not tried alone, and no node is cleared that was not before, so that the moves of a cluster
without checkpoints stay as they were; ``youngest_first`` keeps them too.
"""

from __future__ import annotations

import dataclasses

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis_budget import examples

from gpud.core import schedule
from gpud.model import JobSpec, NodeSpec, Snapshot, TaskPlacement, TaskRequest
from gpud.plugins import make_plugin_manager
from gpud.policy import LEAST_LOST_WORK, YOUNGEST_FIRST, Department, Policy, Project, Resources

from test_properties import NOW, POOL, Room, requests
from test_victims_by_lost_work import lost

PM = make_plugin_manager()
TOL = 1e-6


def checkpointed_this_run(job: JobSpec) -> bool:
    started = job.started if job.started is not None else job.submitted
    return job.checkpointed is not None and job.checkpointed > started


def _policy(victim_order: str, min_runtime: float) -> Policy:
    """Two projects in two departments whose quotas hold the whole cluster: neither reclaim nor
    preemption has a say, only consolidation moves."""
    big = {POOL: Resources(1000.0, 1000.0, 10000.0)}
    return Policy(departments={"a": Department("a", quota=big), "b": Department("b", quota=big)},
                  projects={"p": Project("p", department="a", quota=big), "q": Project("q", department="b", quota=big)},
                  min_runtime_s=min_runtime, victim_order=victim_order)


@st.composite
def scattered_cases(draw) -> tuple[Policy, Snapshot]:
    """Two to four nodes whose GPUs each hold shares of one or two jobs, with room left scattered
    over them, then jobs of every shape (single tasks, gangs, elastic gangs, fractions, memory
    slices, CPU-only) of two projects in two departments where room is left; each job checkpointed
    in its run, before it, or never; and one pending job that no node holds as it stands."""
    specs = [NodeSpec(name=f"n{i}", gpus=draw(st.integers(1, 3)), gpu_memory_gib=draw(st.sampled_from([40.0, 80.0])),
                      cpus=float(draw(st.integers(8, 32))), memory_gib=float(draw(st.integers(32, 128))), pool=POOL)
             for i in range(1, draw(st.integers(2, 4)) + 1)]
    room = Room(specs)
    jobs: list[JobSpec] = []

    def running(request: TaskRequest, placements: list[TaskPlacement], min_tasks: int | None) -> None:
        started = float(draw(st.integers(0, int(NOW))))
        checkpointed = draw(st.one_of(st.none(), st.integers(0, int(NOW)).map(float),
                                      st.integers(int(NOW) - 60, int(NOW)).map(float)))
        seq = len(jobs)
        jobs.append(JobSpec(id=f"j{seq}", project=draw(st.sampled_from(["p", "q"])), request=request, priority=50,
                            tasks=len(placements), min_tasks=min_tasks, submitted=started, started=started,
                            placements=tuple(placements), seq=seq, checkpointed=checkpointed))

    for spec in specs:  # shares of each GPU, some of it left free
        for gpu in range(spec.gpus):
            for share in draw(st.lists(st.sampled_from([0.25, 0.5, 0.75]), min_size=1, max_size=2)):
                if room.share[spec.name][gpu] >= share + 0.25 - TOL:  # at least a quarter stays free
                    room.share[spec.name][gpu] -= share
                    running(TaskRequest(gpus=share), [TaskPlacement(spec.name, (gpu,), share)], None)
    for _ in range(draw(st.integers(0, 4))):
        request = draw(requests())
        tasks = draw(st.integers(1, 3))
        placements = []
        for _ in range(tasks):
            placement = room.take(draw(st.sampled_from([s.name for s in specs])), request)
            if placement is None:
                break
            placements.append(placement)
        if len(placements) < tasks:
            for placement in placements:  # give the partial gang's room back
                for i in placement.gpu_index:
                    room.share[placement.node][i] += placement.gpu_share
                room.cpu[placement.node] += request.cpus
                room.mem[placement.node] += request.memory_gib
            continue
        running(request, placements, draw(st.one_of(st.none(), st.integers(1, tasks))))
    request = draw(st.one_of(st.just(TaskRequest(gpus=1.0)), st.integers(1, 2).map(lambda g: TaskRequest(gpus=float(g))),
                             st.sampled_from([0.5, 0.75]).map(lambda g: TaskRequest(gpus=g))))
    pending = JobSpec(id="want", project=draw(st.sampled_from(["p", "q"])), request=request, priority=50,
                      submitted=NOW - 1.0, seq=100)
    policy = _policy(LEAST_LOST_WORK, draw(st.sampled_from([0.0, 0.0, 300.0])))
    return policy, Snapshot(tuple(specs), tuple(jobs) + (pending,), NOW)


def _room_without(snapshot: Snapshot, gone: tuple[str, int]) -> Room:
    """The nodes' free room with every running task but ``gone`` (job id, task) in place."""
    room = Room(list(snapshot.nodes))
    for job in snapshot.jobs:
        for task, placement in enumerate(job.placements):
            if placement is None or (job.id, task) == gone:
                continue
            for i in placement.gpu_index:
                room.share[placement.node][i] -= placement.gpu_share
            room.cpu[placement.node] -= job.request.cpus
            room.mem[placement.node] -= job.request.memory_gib
    return room


def one_move_would_do(snapshot: Snapshot, pending: JobSpec, job: JobSpec, task: int) -> bool:
    """Whether moving task ``task`` of ``job`` alone lets ``pending`` start on the node it leaves, the task
    going back somewhere (that node included)."""
    placement = job.placements[task]
    assert placement is not None
    room = _room_without(snapshot, (job.id, task))
    if room.take(placement.node, pending.request) is None:
        return False
    return any(room.take(spec.name, job.request) is not None for spec in snapshot.nodes)


def costlier_moves(policy: Policy, snapshot: Snapshot) -> list[str]:
    """The single moves, off the node the cycle cleared, of a job checkpointed in its run that would have
    lost less than the moves the cycle made, or made room with fewer, as words."""
    plan = schedule(snapshot, policy, PM)
    moved = [(e.job, task) for e in plan.evictions if e.rule == "consolidate" for task in e.tasks]
    if not moved:
        return []
    jobs = {job.id: job for job in snapshot.jobs}
    pending = jobs["want"]
    cleared = {b.placement.node for b in plan.binds if b.job == "want"}
    chosen = sum(lost(jobs[j], NOW) for j in dict.fromkeys(j for j, _ in moved))
    wrong = []
    for job in snapshot.jobs:
        if (not job.is_running or not job.preemptible or not checkpointed_this_run(job)
                or NOW - (job.started or 0.0) < policy.min_runtime_s):
            continue
        if len(moved) == 1 and lost(job, NOW) >= chosen - TOL:
            continue
        for task, placement in enumerate(job.placements):
            if placement is not None and placement.node in cleared and one_move_would_do(snapshot, pending, job,
                                                                                         task):
                wrong.append(f"moved {moved} losing {chosen:g} GPU-s; moving task {task} of {job.id} "
                             f"alone loses {lost(job, NOW):g}")
    return wrong


@settings(max_examples=examples(300), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scattered_cases())
def test_no_move_loses_more_than_one_move_of_a_checkpointed_job(case):
    policy, snapshot = case
    assert costlier_moves(policy, snapshot) == []


def _share_job(job_id: str, node: str, gpu: int, share: float, started: float, checkpointed: float | None,
               seq: int, priority: int = 50) -> JobSpec:
    return JobSpec(id=job_id, project="p", request=TaskRequest(gpus=share), priority=priority, submitted=started,
                   started=started, placements=(TaskPlacement(node, (gpu,), share),), seq=seq,
                   checkpointed=checkpointed)


def _large_old_and_small_fresh() -> Snapshot:
    """n1: an old job on 0.75 of GPU 0 that never checkpointed, and a job on 0.5 of GPU 1 that
    checkpointed 5 s ago; n2: 0.25 of its GPU held by a job that never moves. A job of one whole GPU
    waits (1.5 GPUs free, none whole): moving either job off n1 frees a GPU there, and either has
    room on n2."""
    old = _share_job("old", "n1", 0, 0.75, 0.0, None, 1)
    fresh = _share_job("fresh", "n1", 1, 0.5, 100.0, 995.0, 2)
    pinned = _share_job("pinned", "n2", 0, 0.25, 0.0, None, 3, priority=100)
    want = JobSpec(id="want", project="p", request=TaskRequest(gpus=1.0), priority=50, submitted=995.0, seq=4)
    nodes = (NodeSpec("n1", gpus=2, pool=POOL), NodeSpec("n2", gpus=1, pool=POOL))
    return Snapshot(nodes, (old, fresh, pinned, want), NOW)


def test_the_job_that_just_checkpointed_moves_not_the_larger_old_one():
    plan = schedule(_large_old_and_small_fresh(), _policy(LEAST_LOST_WORK, 60.0), PM)
    assert [(e.job, e.rule, e.moved) for e in plan.evictions] == [("fresh", "consolidate", True)]
    assert sorted(b.job for b in plan.binds) == ["fresh", "want"]


def test_youngest_first_moves_the_largest_holder_as_before():
    plan = schedule(_large_old_and_small_fresh(), _policy(YOUNGEST_FIRST, 60.0), PM)
    assert [(e.job, e.rule, e.moved) for e in plan.evictions] == [("old", "consolidate", True)]


def test_without_its_checkpoint_the_larger_holder_moves_as_before():
    snapshot = _large_old_and_small_fresh()
    never = Snapshot(snapshot.nodes, tuple(dataclasses.replace(j, checkpointed=None) for j in snapshot.jobs),
                     snapshot.now)
    plan = schedule(never, _policy(LEAST_LOST_WORK, 60.0), PM)
    assert [(e.job, e.rule) for e in plan.evictions] == [("old", "consolidate")]
