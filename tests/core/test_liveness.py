"""Liveness of reclaim and preemption over random clusters of every job shape (hypothesis).

Whenever a project is below its quota and its fair share, its first pending
job fits within both, and evicting preemptible jobs of projects over their
fair share (past the minimum run time, each victim allowed by the per-victim
rule, in victim order) would make room for it, that job runs within three
cycles. The room is worked out here, independently of the core: victims are
taken in victim order while their project (and, across departments, their
department) is still over its fair share, and over its quota (a queue within
its quota is never a victim), in a resource the job needs and the victim
holds; then the job's tasks are placed first-fit on what is free.

Likewise inside a project: when its first pending job (or a running elastic
job with tasks still to add) stays, with its project and department, within
the fair share, and evicting the project's lower-priority preemptible jobs
past the minimum run time would make room, it runs (or grows) within three
cycles.
"""

from __future__ import annotations

import os
import dataclasses
from collections import defaultdict

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis_budget import examples

from gpud.core import schedule
from gpud.model import JobSpec, NodeSpec, Plan, Resources, Snapshot, TaskRequest
from gpud.simulate import apply_plan

from gpud.policy import Department, Policy, Project
from gpud.reasons import pending_texts

from test_properties import NOW, PM, POOL, TOL, Case, Room, cases, project_alloc

# The figure is 1,000 examples: LIVENESS_EXAMPLES=1000 runs that many (about 10 minutes on a loaded machine).
LIVENESS = settings(max_examples=int(os.environ.get("LIVENESS_EXAMPLES", examples(200))), deadline=None,
                    suppress_health_check=[HealthCheck.too_slow])
RESOURCES = ("gpu", "cpu", "memory")


@st.composite
def small_requests(draw) -> TaskRequest:
    """Requests of every shape, light on CPUs and memory, so GPUs are what runs short."""
    kind = draw(st.sampled_from(["whole", "whole", "whole", "fraction", "memory", "cpu"]))
    cpus, memory = float(draw(st.integers(0, 2))), float(draw(st.integers(0, 4)))
    if kind == "whole":
        return TaskRequest(gpus=float(draw(st.integers(1, 4))), cpus=cpus, memory_gib=memory)
    if kind == "fraction":
        return TaskRequest(gpus=draw(st.sampled_from([0.25, 0.5, 0.75])), cpus=cpus, memory_gib=memory)
    if kind == "memory":
        return TaskRequest(gpus=0.0, gpu_memory_gib=float(draw(st.sampled_from([10, 20, 40]))), cpus=cpus,
                           memory_gib=memory)
    return TaskRequest(gpus=0.0, cpus=float(draw(st.integers(1, 4))), memory_gib=memory)


@st.composite
def contended(draw) -> Case:
    """A busy cluster: nodes filled with running jobs of every shape (gangs across nodes, elastic gangs
    above their minimum, fractions, memory slices, CPU-only) of projects p2 and p3 (some of p1), and
    pending jobs of every shape, mostly of p1, which has a quota and holds little."""
    specs = [NodeSpec(name=f"n{i}", gpus=draw(st.integers(2, 8)), gpu_memory_gib=draw(st.sampled_from([40.0, 80.0])),
                      cpus=float(draw(st.integers(8, 32))), memory_gib=64.0, pool=POOL)
             for i in range(1, draw(st.integers(1, 3)) + 1)]
    capacity = sum(n.gpus for n in specs)
    departments = draw(st.booleans())
    quotas = {"p1": float(draw(st.integers(1, max(1, capacity // 2)))),
              "p2": float(draw(st.integers(0, 3))), "p3": float(draw(st.integers(0, 3)))}
    member = {"p1": "D1", "p2": "D1" if draw(st.booleans()) else "D2", "p3": "D2"} if departments else {}
    projects = {name: Project(name=name, quota={POOL: Resources(gpu=quota)},
                              over_quota_weight=float(draw(st.integers(1, 2))), department=member.get(name, "default"))
                for name, quota in quotas.items()}
    if departments:
        depts = {d: Department(d, quota={POOL: Resources(gpu=sum(q for n, q in quotas.items() if member[n] == d)
                                                             + draw(st.integers(0, 2)))})
                 for d in ("D1", "D2")}
    else:
        depts = {"default": Department("default", implicit=True)}
    policy = Policy(departments=depts, projects=projects, min_runtime_s=draw(st.sampled_from([0.0, 300.0])),
                    placement=draw(st.sampled_from(["binpack", "spread"])))
    room = Room(specs)
    jobs: list[JobSpec] = []
    for seq in range(draw(st.integers(2, 14))):
        request = draw(small_requests())
        tasks = draw(st.integers(1, 3))
        min_tasks = draw(st.one_of(st.none(), st.integers(1, tasks)))
        placements = []
        for _ in range(tasks):
            placement = next((p for p in (room.take(n, request) for n in draw(st.permutations(sorted(room.specs))))
                              if p is not None), None)
            if placement is None:
                break
            placements.append(placement)
        minimum = tasks if min_tasks is None else min_tasks
        if len(placements) < minimum:
            for placement in placements:
                for i in placement.gpu_index:
                    room.share[placement.node][i] += placement.gpu_share
                room.cpu[placement.node] += request.cpus
                room.mem[placement.node] += request.memory_gib
            continue
        started = float(draw(st.sampled_from([0, 100, 400, 650, 900])))
        jobs.append(JobSpec(id=f"r{seq}", project=draw(st.sampled_from(["p1", "p2", "p2", "p3", "p3"])),
                            request=request, priority=draw(st.sampled_from([50, 50, 75, 100])), tasks=tasks,
                            min_tasks=min_tasks, submitted=started, started=started, seq=seq,
                            placements=tuple(placements) + (None,) * (tasks - len(placements))))
    for seq in range(100, 100 + draw(st.integers(1, 3))):
        tasks = draw(st.integers(1, 3))
        jobs.append(JobSpec(id=f"w{seq}", project=draw(st.sampled_from(["p1", "p1", "p1", "p2", "p3"])),
                            request=draw(small_requests()), priority=draw(st.sampled_from([50, 50, 75, 100])),
                            tasks=tasks, min_tasks=draw(st.one_of(st.none(), st.integers(1, tasks))),
                            submitted=float(draw(st.integers(900, 990))), seq=seq, placements=(None,) * tasks))
    return Case(policy, Snapshot(tuple(specs), tuple(jobs), NOW), 3)


def task_need(job: JobSpec, snapshot: Snapshot) -> Resources:
    """What one task of the job holds at most (a memory slice on the smallest GPU that holds it)."""
    request = job.request
    if request.gpu_memory_gib is not None:
        sizes = [n.gpu_memory_gib for n in snapshot.nodes if n.gpus and n.gpu_memory_gib >= request.gpu_memory_gib]
        gpu = request.gpu_memory_gib / min(sizes) if sizes else 1.0
    else:
        gpu = request.gpus
    return Resources(gpu, request.cpus, request.memory_gib)


def tasks_to_start(job: JobSpec) -> int:
    """How many tasks of a job with pending tasks must start together: the rest of its minimum, at least one."""
    return max(job.gang_minimum - job.running_tasks, 1)


def fits(held: Resources, need: Resources, level: Resources, unset_is_unbounded: bool = False) -> bool:
    """Whether ``held + need`` stays within ``level`` in every resource ``need`` uses."""
    for r in RESOURCES:
        bound = level.get(r)
        if unset_is_unbounded and r != "gpu" and bound <= 0:
            continue
        if need.get(r) > TOL and held.get(r) + need.get(r) > bound + TOL:
            return False
    return True


def bound(quota: Resources) -> Resources:
    """What a quota enforces: GPUs always, CPUs and memory only where set (a queue within it is no victim)."""
    return Resources(quota.gpu, quota.cpu or float("inf"), quota.memory or float("inf"))


def over(held: Resources, level: Resources, resources: list[str]) -> bool:
    """Whether ``held`` is over ``level`` in one of ``resources``."""
    return any(held.get(r) > level.get(r) + TOL for r in resources)


def victim_key(job: JobSpec) -> tuple:
    """Lowest priority first, then most recently started."""
    started = job.started if job.started is not None else job.submitted
    return (job.priority, -started, -job.seq, job.id)


def room_by_reclaim(case: Case, job: JobSpec, shares: dict[str, Resources],
                    dept_shares: dict[str, Resources]) -> bool:
    """Whether evicting allowed victims (see the module) leaves room for the job's tasks that must start."""
    policy, snapshot = case.policy, case.snapshot
    project = policy.projects[job.project]
    need = task_need(job, snapshot)
    held = project_alloc(snapshot)
    dept_held: dict[str, Resources] = defaultdict(Resources)
    for name, amount in held.items():
        dept_held[policy.projects[name].department] += amount
    candidates = sorted((j for j in snapshot.jobs if j.is_running and j.preemptible and j.project != job.project
                         and NOW - (j.started if j.started is not None else j.submitted) >= policy.min_runtime_s),
                        key=victim_key)
    # An elastic victim loses its tasks above its minimum first; the rest is a victim of its own, judged again.
    steps = []
    for victim in candidates:
        running = [t for t, p in enumerate(victim.placements) if p is not None]
        spare = len(running) - victim.gang_minimum
        if spare > 0:
            steps.append((victim, running[len(running) - spare:]))
        steps.append((victim, running))
    gone: dict[str, set[int]] = defaultdict(set)
    for victim, tasks in steps:
        tasks = [t for t in tasks if t not in gone[victim.id]]
        if not tasks:
            continue
        owner = policy.projects[victim.project]
        request = victim.request
        gives = Resources(1.0 if request.uses_gpu else 0.0, request.cpus, request.memory_gib)
        shared = [r for r in RESOURCES if gives.get(r) > TOL and need.get(r) > TOL]
        if not over(held[victim.project], shares[victim.project], shared) or not over(
                held[victim.project], bound(owner.quota_in(POOL)), shared):
            continue
        department = policy.departments[owner.department]
        if owner.department != project.department and not (
                over(dept_held[owner.department], dept_shares[owner.department], shared)
                and (department.implicit or over(dept_held[owner.department], bound(department.quota_in(POOL)), shared))):
            continue
        gone[victim.id].update(tasks)
        for t in tasks:
            p = victim.placements[t]
            freed = Resources(p.gpu_share * len(p.gpu_index), request.cpus, request.memory_gib)
            held[victim.project] -= freed
            dept_held[owner.department] -= freed
    room = Room(list(snapshot.nodes))
    for other in snapshot.jobs:
        for t, p in enumerate(other.placements):
            if p is not None and t not in gone[other.id]:
                for i in p.gpu_index:
                    room.share[p.node][i] -= p.gpu_share
                room.cpu[p.node] -= other.request.cpus
                room.mem[p.node] -= other.request.memory_gib
    for _ in range(tasks_to_start(job)):
        if not any(room.take(node, job.request) is not None for node in sorted(room.specs)):
            return False
    return True


def starving_heads(case: Case, plan: Plan) -> list[JobSpec]:
    """The first pending job of each project below its quota and fair share that fits within both,
    and for which reclaim could make room; ``plan`` is the cycle's on ``case.snapshot`` (its fair shares)."""
    policy, snapshot = case.policy, case.snapshot
    shares = {q.name: q.fair_share for q in plan.queues if q.kind == "project"}
    dept_shares = {q.name: q.fair_share for q in plan.queues if q.kind == "department"}
    held = project_alloc(snapshot)
    dept_held: dict[str, Resources] = defaultdict(Resources)
    for name, amount in held.items():
        dept_held[policy.projects[name].department] += amount
    found = []
    for name, project in policy.projects.items():
        waiting = [j for j in snapshot.jobs if j.project == name and j.running_tasks < j.tasks]
        if not waiting:
            continue
        head = min(waiting, key=lambda j: (-j.priority, j.submitted, j.seq))
        need = task_need(head, snapshot).scaled(tasks_to_start(head))
        if not (fits(held[name], need, shares[name]) and fits(held[name], need, project.quota_in(POOL), True)):
            continue
        department = policy.departments[project.department]
        if not department.implicit and not (
                fits(dept_held[department.name], need, dept_shares[department.name])
                and fits(dept_held[department.name], need, department.quota_in(POOL), True)):
            continue
        if room_by_reclaim(case, head, shares, dept_shares):
            found.append(head)
    return found


def room_by_preemption(case: Case, job: JobSpec) -> bool:
    """Whether evicting every preemptible job of the job's project below its priority, past the minimum
    run time, leaves room for the job's tasks that must start (an elastic job's next task included)."""
    policy, snapshot = case.policy, case.snapshot
    victims = {j.id for j in snapshot.jobs if j.project == job.project and j.is_running and j.preemptible
               and j.priority < job.priority and j.id != job.id
               and NOW - (j.started if j.started is not None else j.submitted) >= policy.min_runtime_s}
    if not victims:
        return False
    room = Room(list(snapshot.nodes))
    for other in snapshot.jobs:
        if other.id in victims:
            continue
        for p in other.placements:
            if p is not None:
                for i in p.gpu_index:
                    room.share[p.node][i] -= p.gpu_share
                room.cpu[p.node] -= other.request.cpus
                room.mem[p.node] -= other.request.memory_gib
    for _ in range(tasks_to_start(job)):
        if not any(room.take(node, job.request) is not None for node in sorted(room.specs)):
            return False
    return True


def outranking_heads(case: Case, plan: Plan) -> list[JobSpec]:
    """The first pending job of each project (a running elastic job with tasks to add included) whose
    project and department stay within their fair share with it, that a non-preemptible job's quota
    admits, and for which evicting lower-priority jobs of its own project would make room: preemption
    serves it (no limit and no over-quota ban in play)."""
    policy, snapshot = case.policy, case.snapshot
    shares = {q.name: q.fair_share for q in plan.queues if q.kind == "project"}
    dept_shares = {q.name: q.fair_share for q in plan.queues if q.kind == "department"}
    held = project_alloc(snapshot)
    fixed = project_alloc(snapshot, lambda j: not j.preemptible)
    dept_held: dict[str, Resources] = defaultdict(Resources)
    dept_fixed: dict[str, Resources] = defaultdict(Resources)
    for name in policy.projects:
        dept_held[policy.projects[name].department] += held[name]
        dept_fixed[policy.projects[name].department] += fixed[name]
    found = []
    for name, project in policy.projects.items():
        waiting = [j for j in snapshot.jobs if j.project == name and j.running_tasks < j.tasks]
        if not waiting:
            continue
        head = min(waiting, key=lambda j: (-j.priority, j.submitted, j.seq))
        need = task_need(head, snapshot).scaled(tasks_to_start(head))
        department = policy.departments[project.department]
        levels = [(project, held[name], fixed[name], shares[name])]
        if not department.implicit:
            levels.append((department, dept_held[department.name], dept_fixed[department.name],
                           dept_shares[department.name]))
        if any(level.limit_in(POOL) is not None or not level.over_quota or not fits(amount, need, share)
               or (not head.preemptible and not fits(kept, need, bound(level.quota_in(POOL)), True))
               for level, amount, kept, share in levels):
            continue
        if room_by_preemption(case, head):
            found.append(head)
    return found


@LIVENESS
@given(contended())
def test_a_starving_project_gets_its_first_job_running_within_three_cycles(case):
    check_liveness(case)


@LIVENESS
@given(cases())
def test_liveness_holds_on_the_generic_random_clusters(case):
    check_liveness(case)


def check_liveness(case: Case) -> None:
    """The property (see the module) on one case."""
    # The premise is asked before each of three cycles: a job whose project stayed starving with room
    # to reclaim before all three must have gained tasks by the end of the third. (Asked only once,
    # it could fail for want of room another starving project took first, within its own fair share.)
    snapshots, starving = [case.snapshot], []
    for _ in range(3):
        now = dataclasses.replace(case, snapshot=snapshots[-1])
        plan = schedule(now.snapshot, case.policy, PM)
        heads = starving_heads(now, plan) + outranking_heads(now, plan)
        starving.append({job.id: job for job in heads})
        snapshots.append(apply_plan(now.snapshot, plan))
    first = {job.id: job for job in snapshots[0].jobs}
    last = {job.id: job for job in snapshots[-1].jobs}
    for job_id in set(starving[0]) & set(starving[1]) & set(starving[2]):
        assert last[job_id].running_tasks > first[job_id].running_tasks, (
            f"{job_id} of project {first[job_id].project} gained no task in 3 cycles: "
            f"{pending_texts(plan).get(job_id, 'running')}")
