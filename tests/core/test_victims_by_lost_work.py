"""Victims of one priority go in order of the work they would lose: GPU-seconds since their last checkpoint.

The property runs the core over random clusters of every job shape (single tasks, gangs, elastic
gangs, fractions, memory slices, CPU-only, departments) in which many running jobs have a twin: a
job of the same project, priority and shape, on the same node, whose GPUs hold the same others'
shares. Evicting the twin instead is then an allowed choice under every rule (same queue, same
resources freed in the same place), so an eviction that loses more GPU-seconds than its twin, the
twin still running, is a wrong choice.
"""

from __future__ import annotations

import dataclasses
from collections import defaultdict

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis_budget import examples

from gpud.core import schedule
from gpud.core.orders import LeastLostWorkVictimOrder, PriorityVictimOrder
from gpud.core.victim import Victim
from gpud.errors import ConfigError
from gpud.model import JobSpec, NodeSpec, Snapshot, TaskPlacement, TaskRequest
from gpud.plugins import make_plugin_manager
from gpud.policy import LEAST_LOST_WORK, YOUNGEST_FIRST, Department, Policy, Project, Resources
from gpud.policy_file import parse_policy

from test_properties import NOW, POOL, Case, Room, department_total, policies, project_alloc, requests, run_cycles

PM = make_plugin_manager()
TOL = 1e-6


def lost(job: JobSpec, now: float) -> float:
    """GPU-seconds the running job would lose if stopped at ``now`` (the formula of docs/scheduling.md)."""
    gpus = sum(p.gpu_share * len(p.gpu_index) for p in job.placements if p is not None)
    started = job.started if job.started is not None else job.submitted
    since = max(started, job.checkpointed) if job.checkpointed is not None else started
    return gpus * max(0.0, now - since)


@st.composite
def small_nodes(draw) -> list[NodeSpec]:
    """One to three small nodes, so that twins fill them and pending jobs must evict."""
    return [NodeSpec(name=f"n{i}", gpus=draw(st.integers(1, 4)), gpu_memory_gib=draw(st.sampled_from([40.0, 80.0])),
                     cpus=float(draw(st.integers(4, 16))), memory_gib=float(draw(st.integers(16, 64))), pool=POOL)
            for i in range(1, draw(st.integers(1, 3)) + 1)]


@st.composite
def twin_cases(draw, victim_order: str = LEAST_LOST_WORK) -> Case:
    """A random cluster where about half the running jobs have a twin next to them."""
    policy = draw(policies())
    policy = dataclasses.replace(policy, victim_order=victim_order,
                                 min_runtime_s=draw(st.sampled_from([0.0, 0.0, 0.0, policy.min_runtime_s])))
    specs = draw(small_nodes())
    room = Room(specs)
    jobs: list[JobSpec] = []
    seq = 0
    for _ in range(draw(st.integers(1, 8))):
        request = draw(requests())
        tasks = draw(st.integers(1, 3))
        min_tasks = draw(st.one_of(st.none(), st.integers(1, tasks)))
        job = JobSpec(id=f"j{seq}", project=draw(st.sampled_from(sorted(policy.projects))), request=request,
                      priority=draw(st.sampled_from([50, 50, 75, 100])), tasks=tasks, min_tasks=min_tasks,
                      submitted=float(draw(st.integers(0, 300))), seq=seq, placements=(None,) * tasks)
        seq += 1
        copies = draw(st.sampled_from([0, 1, 2, 2, 3]))
        if copies == 0:
            jobs.append(job)
            continue
        nodes_of = [draw(st.sampled_from(sorted(room.specs))) for _ in range(draw(st.integers(job.gang_minimum,
                                                                                             tasks)))]
        for copy in range(copies):
            placements = []
            for node in nodes_of:
                placement = room.take(node, request)
                if placement is None:
                    break
                placements.append(placement)
            if len(placements) < len(nodes_of):
                _give_back(room, placements, request)
                break
            started = float(draw(st.integers(int(job.submitted), int(NOW))))
            checkpointed = draw(st.one_of(st.none(), st.integers(int(NOW) - 200, int(NOW)).map(float)))
            twin = dataclasses.replace(job, id=f"j{seq - 1}" if copy == 0 else f"j{seq}", seq=seq - 1 + copy,
                                       placements=tuple(placements) + (None,) * (tasks - len(placements)),
                                       started=started, checkpointed=checkpointed)
            jobs.append(twin)
            if copy:
                seq += 1
    # The pending job that will want room: a preemptor or a reclaimer. One alone: with several, an
    # eviction of one action may be undone by the next, and the twin that stays is not a choice one
    # action made.
    running_projects = sorted({j.project for j in jobs if j.is_running}) or sorted(policy.projects)
    for _ in range(1):
        request = draw(requests())
        tasks = draw(st.integers(1, 2))
        project = draw(st.sampled_from(running_projects if draw(st.booleans()) else sorted(policy.projects)))
        jobs.append(JobSpec(id=f"j{seq}", project=project, request=request,
                            priority=draw(st.sampled_from([75, 100, 125])), tasks=tasks,
                            submitted=float(draw(st.integers(0, int(NOW)))), seq=seq, placements=(None,) * tasks))
        seq += 1
    return Case(policy, Snapshot(tuple(specs), tuple(jobs), NOW), draw(st.integers(1, 2)))


def _give_back(room: Room, placements: list[TaskPlacement], request: TaskRequest) -> None:
    for placement in placements:
        for i in placement.gpu_index:
            room.share[placement.node][i] += placement.gpu_share
        room.cpu[placement.node] += request.cpus
        room.mem[placement.node] += request.memory_gib


def _tenants(snapshot: Snapshot) -> dict[tuple[str, int], dict[str, float]]:
    """The share each job holds of each GPU, by (node, GPU index)."""
    held: dict[tuple[str, int], dict[str, float]] = defaultdict(lambda: defaultdict(float))
    for job in snapshot.jobs:
        for p in job.placements:
            if p is not None:
                for i in p.gpu_index:
                    held[(p.node, i)][job.id] += p.gpu_share
    return held


def _where(job: JobSpec, partner: str, tenants: dict[tuple[str, int], dict[str, float]]) -> list:
    """Each GPU the job holds a share of: its node, the job's share of it, the partner's (the other job of
    the pair compared) and every other job's share of it."""
    gpus = {(p.node, i) for p in job.placements if p is not None for i in p.gpu_index}
    return sorted((node, held[job.id], held.get(partner, 0.0),
                   tuple(sorted((other, share) for other, share in held.items() if other not in (job.id, partner))))
                  for node, i in gpus for held in [tenants[(node, i)]])


def _twins(a: JobSpec, b: JobSpec, tenants: dict[tuple[str, int], dict[str, float]]) -> bool:
    """Whether evicting ``b`` instead of ``a`` is allowed under every rule and frees the same room: the same
    project, priority and shape, holding the same shares of GPUs on the same nodes, each GPU shared with the
    very same other jobs at the same shares. A GPU the two share matches one where each holds what the
    other holds there."""
    return (a.project == b.project and a.priority == b.priority and a.request == b.request and a.tasks == b.tasks
            and a.min_tasks == b.min_tasks and dict(a.node_selector) == dict(b.node_selector) and a.pool == b.pool
            and _where(a, b.id, tenants) == _where(b, a.id, tenants))


def must_give_back(policy: Policy, preemptor: JobSpec) -> bool:
    """Whether the preemptor's project may have to give resources back before it may take the job (no
    going over quota, or a non-preemptible job): then victims go in victim order until it may, and
    which of them come back depends on where the job lands, not on the order. Left out."""
    project = policy.projects[preemptor.project]
    department = policy.departments[project.department]
    return (not preemptor.preemptible or not project.over_quota
            or (not department.implicit and not department.over_quota))


def wrong_choices(case: Case) -> list[str]:
    """Every eviction whose still-running twin, as old and as allowed, would have lost fewer GPU-seconds."""
    found = []
    for before, plan, after in run_cycles(case, case.cycles):
        now = before.now
        old_enough = now - case.policy.min_runtime_s
        jobs = {j.id: j for j in before.jobs}
        tenants = _tenants(before)
        untouched = {j.id for j in after.jobs if j.placements == jobs[j.id].placements and j.is_running}
        for eviction in plan.evictions:
            victim = jobs[eviction.job]
            if eviction.rule == "preempt" and must_give_back(case.policy, jobs[eviction.for_job]):
                continue
            for other in before.jobs:
                if (other.id != victim.id and other.id in untouched and other.is_running
                        and (other.started or 0.0) <= old_enough and _twins(victim, other, tenants)
                        and lost(victim, now) > lost(other, now) + TOL):
                    found.append(f"{eviction.rule} evicted {victim.id} losing {lost(victim, now):g} GPU-s; "
                                 f"its twin {other.id} would have lost {lost(other, now):g}")
    return found


@settings(max_examples=examples(150), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(twin_cases())
def test_no_eviction_loses_more_than_an_allowed_twin_would(case):
    wrong = wrong_choices(case)
    assert not wrong, (wrong, case.policy, case.snapshot)


# --- the order itself ---------------------------------------------------------------------------

def _running(job_id: str, gpus: int, started: float, checkpointed: float | None, node: str, first_gpu: int,
             seq: int, priority: int = 50) -> JobSpec:
    placement = TaskPlacement(node, tuple(range(first_gpu, first_gpu + gpus)), 1.0)
    return JobSpec(id=job_id, project="p", request=TaskRequest(gpus=float(gpus)), priority=priority,
                   submitted=started, started=started, placements=(placement,), seq=seq, checkpointed=checkpointed)


def _two_train_jobs_and_an_inference(victim_order: str) -> tuple[Policy, Snapshot]:
    policy = Policy(departments={"default": Department("default", implicit=True)},
                    projects={"p": Project("p", quota={POOL: Resources(2.0)})}, min_runtime_s=60.0,
                    victim_order=victim_order)
    x = _running("x", 1, started=100.0, checkpointed=990.0, node="n1", first_gpu=0, seq=1)
    y = _running("y", 1, started=500.0, checkpointed=None, node="n1", first_gpu=1, seq=2)
    high = JobSpec(id="z", project="p", request=TaskRequest(gpus=1.0), priority=75, submitted=995.0, seq=3)
    return policy, Snapshot((NodeSpec("n1", gpus=2, pool=POOL),), (x, y, high), 1000.0)


def test_the_job_checkpointed_just_now_is_the_victim_not_the_younger_one():
    policy, snapshot = _two_train_jobs_and_an_inference(LEAST_LOST_WORK)
    plan = schedule(snapshot, policy, PM)
    assert [(e.job, e.rule) for e in plan.evictions] == [("x", "preempt")]
    assert [b.job for b in plan.binds] == ["z"]


def test_youngest_first_keeps_the_old_order():
    policy, snapshot = _two_train_jobs_and_an_inference(YOUNGEST_FIRST)
    plan = schedule(snapshot, policy, PM)
    assert [(e.job, e.rule) for e in plan.evictions] == [("y", "preempt")]


def test_a_checkpoint_from_before_the_run_began_counts_as_none():
    x = _running("x", 2, started=900.0, checkpointed=100.0, node="n1", first_gpu=0, seq=1)
    victim = Victim(x, None, [0], 1000.0)
    assert victim.lost_gpu_seconds == pytest.approx(200.0)
    assert LeastLostWorkVictimOrder().key(victim)[:2] == (50, pytest.approx(200.0))
    assert PriorityVictimOrder().key(victim)[:2] == (50, -900.0)


def test_more_gpus_lose_more_for_the_same_time():
    small = Victim(_running("s", 1, 500.0, 900.0, "n1", 0, 1), None, [0], 1000.0)
    large = Victim(_running("l", 4, 500.0, 950.0, "n1", 1, 2), None, [0], 1000.0)
    assert small.lost_gpu_seconds == pytest.approx(100.0) and large.lost_gpu_seconds == pytest.approx(200.0)
    order = LeastLostWorkVictimOrder()
    assert order.key(small) < order.key(large)


def test_the_policy_file_names_the_victim_order():
    assert parse_policy({"victim_order": "youngest_first"}, "p.toml").victim_order == YOUNGEST_FIRST
    assert parse_policy({}, "p.toml").victim_order == LEAST_LOST_WORK
    with pytest.raises(ConfigError, match="victim_order must be one of"):
        parse_policy({"victim_order": "oldest"}, "p.toml")


# --- the set of victims: never more lost than one allowed victim alone -------------------------

@st.composite
def crowded_cases(draw) -> Case:
    """Small nodes full of running jobs of every shape (single tasks, gangs, elastic gangs, fractions,
    memory slices, CPU-only; projects in departments), each with its own start and checkpoint, and one
    pending job of one task, of any request kind, that must evict to start."""
    policy = draw(policies())
    # Projects that may go over quota: a preemptor that must first give its project's quota back takes
    # victims in order until it may (must_give_back), whatever they lose.
    projects = {name: dataclasses.replace(p, over_quota=True) for name, p in policy.projects.items()}
    policy = dataclasses.replace(policy, projects=projects, min_runtime_s=draw(st.sampled_from([0.0, 0.0, 300.0])))
    specs = [NodeSpec(name=f"n{i}", gpus=draw(st.integers(1, 3)), gpu_memory_gib=draw(st.sampled_from([40.0, 80.0])),
                      cpus=32.0, memory_gib=128.0, pool=POOL) for i in range(1, draw(st.integers(2, 4)) + 1)]
    room = Room(specs)
    jobs: list[JobSpec] = []
    seq = 0
    for _ in range(draw(st.integers(3, 12))):
        # Fractions often: a whole GPU then takes several victims, and the sets of victims differ.
        request = draw(st.one_of(requests(), st.sampled_from([0.25, 0.5]).map(lambda share: TaskRequest(gpus=share))))
        tasks = draw(st.integers(1, 3))
        min_tasks = draw(st.one_of(st.none(), st.integers(1, tasks)))
        job = JobSpec(id="", project=draw(st.sampled_from(sorted(policy.projects)[:draw(st.integers(1, 3))])),
                      request=request, priority=draw(st.sampled_from([25, 50, 50, 50, 50, 100])), tasks=tasks,
                      min_tasks=min_tasks, submitted=0.0, placements=(None,) * tasks)
        nodes_of = [draw(st.sampled_from(sorted(room.specs))) for _ in range(draw(st.integers(job.gang_minimum, tasks)))]
        # Jobs alike, each with its own start and checkpoint, side by side (sharing GPUs where they are fractions).
        for _ in range(draw(st.sampled_from([1, 1, 2, 3]))):
            placements = []
            for node in nodes_of:
                placement = room.take(node, request)
                if placement is None:
                    break
                placements.append(placement)
            if len(placements) < job.gang_minimum:
                _give_back(room, placements, request)
                break
            started = float(draw(st.integers(0, int(NOW))))
            checkpointed = draw(st.one_of(st.none(), st.integers(0, int(NOW)).map(float)))
            jobs.append(dataclasses.replace(job, id=f"j{seq}", seq=seq, started=started, checkpointed=checkpointed,
                                            placements=tuple(placements) + (None,) * (tasks - len(placements))))
            seq += 1
    running_projects = sorted({j.project for j in jobs}) or sorted(policy.projects)
    project = draw(st.sampled_from(running_projects if draw(st.integers(0, 3)) else sorted(policy.projects)))
    wants = draw(st.one_of(requests(), st.just(TaskRequest(gpus=1.0))))
    jobs.append(JobSpec(id="wants", project=project, request=wants,
                        priority=draw(st.sampled_from([75, 75, 75, 100, 125])), submitted=NOW, seq=len(jobs) + 100,
                        placements=(None,)))
    return Case(policy, Snapshot(tuple(specs), tuple(jobs), NOW), 1)


def _fits_without(snapshot: Snapshot, job: JobSpec, node: str, gone: JobSpec) -> bool:
    """Whether one task of ``job`` fits on ``node`` were the tasks of ``gone`` there stopped."""
    spec = next(n for n in snapshot.nodes if n.name == node)
    share, cpu, mem = [1.0] * spec.gpus, spec.cpus, spec.memory_gib
    for other in snapshot.jobs:
        for p in other.placements:
            if p is not None and p.node == node and other.id != gone.id:
                for i in p.gpu_index:
                    share[i] -= p.gpu_share
                cpu -= other.request.cpus
                mem -= other.request.memory_gib
    request = job.request
    if request.cpus > cpu + 1e-9 or request.memory_gib > mem + 1e-9:
        return False
    if not request.uses_gpu:
        return True
    if request.is_shared:
        if request.gpu_memory_gib is not None and request.gpu_memory_gib > spec.gpu_memory_gib:
            return False
        return max(share) >= request.gpu_share_on(spec.gpu_memory_gib) - 1e-9
    return sum(1 for free in share if free >= 1.0 - 1e-9) >= request.whole_gpus


def _held_on(job: JobSpec, node: str) -> Resources:
    held = Resources()
    for p in job.placements:
        if p is not None and p.node == node:
            held += Resources(p.gpu_share * len(p.gpu_index), job.request.cpus, job.request.memory_gib)
    return held


def _within_share(case: Case, plan, preemptor: JobSpec, gone: JobSpec, node: str) -> bool:
    """Whether the preemptor, taking its task with ``gone`` stopped on ``node`` alone, keeps its project and
    department within the larger of their fair share and what they hold (the preempt rule)."""
    snapshot = case.snapshot
    department = case.policy.projects[preemptor.project].department
    held = project_alloc(snapshot)
    levels = [(r, held.get(preemptor.project, Resources())) for r in plan.queues
              if r.kind == "project" and r.name == preemptor.project]
    levels += [(r, department_total(case.policy, held, department)) for r in plan.queues
               if r.kind == "department" and r.name == department]
    freed = _held_on(gone, node)
    request = preemptor.request
    spec = next(n for n in snapshot.nodes if n.name == node)
    # A memory slice holds its share of the node's GPU: less on a larger GPU.
    gpus = request.gpus if request.gpu_memory_gib is None else request.gpu_share_on(spec.gpu_memory_gib)
    need = Resources(gpus, request.cpus, request.memory_gib)
    for report, before in levels:
        for r in ("gpu", "cpu", "memory"):
            allowed = max(report.fair_share.get(r), before.get(r))
            if before.get(r) + need.get(r) - freed.get(r) > allowed + 1e-6:
                return False
    return True


def _may_go_instead(case: Case, plan, preemptor: JobSpec, chosen: list[JobSpec], other: JobSpec) -> bool:
    """Whether the rules that evicted ``chosen`` would let ``other`` go alone in their place: for preemption,
    a preemptible job of the preemptor's project below its priority; for reclaim, a job of a queue a chosen
    victim came from, holding the same kinds of resource."""
    rules = {e.rule for e in plan.evictions}
    if rules == {"preempt"}:
        return other.project == preemptor.project and other.priority < preemptor.priority
    if rules == {"reclaim"}:
        def kinds(job: JobSpec) -> tuple[bool, bool, bool]:
            return job.request.uses_gpu, job.request.cpus > 0, job.request.memory_gib > 0
        return any(other.project == v.project and kinds(other) == kinds(v) for v in chosen)
    return False


def costlier_than_one(case: Case) -> list[str]:
    """Evictions for the one-task job that lose more GPU-seconds, in all, than one allowed victim whose
    stop alone would have made room for it (or whose priority is lower than every chosen one's)."""
    snapshot = case.snapshot
    plan = schedule(snapshot, case.policy, PM)
    preemptor = next(j for j in snapshot.jobs if j.id == "wants")
    mine = [e for e in plan.evictions if e.for_job == "wants"]
    if not mine or len(mine) != len(plan.evictions) or any(e.rule == "consolidate" for e in mine):
        return []
    if {e.rule for e in mine} == {"preempt"} and must_give_back(case.policy, preemptor):
        return []
    evicted = {(e.job, task) for e in mine for task in e.tasks}
    if any(b.job != "wants" and (b.job, b.task) not in evicted for b in plan.binds):
        return []  # another job started or grew before the preemptor's turn: the room it saw is not the snapshot's
    others = dataclasses.replace(snapshot, jobs=tuple(j for j in snapshot.jobs if j.id != "wants"))
    without = schedule(others, case.policy, PM)
    if without.binds or without.evictions:
        return []  # so did one that the preemptor then evicted again (an elastic job grown by a task, say)
    jobs = {j.id: j for j in snapshot.jobs}
    chosen = [jobs[job_id] for job_id in dict.fromkeys(e.job for e in mine)]
    total = sum(lost(v, NOW) for v in chosen)
    highest = max(v.priority for v in chosen)
    found = []
    for other in snapshot.jobs:
        if (other.id in jobs and other not in chosen and other.is_running and other.preemptible
                and other.priority <= highest and (other.started or 0.0) <= NOW - case.policy.min_runtime_s
                and _may_go_instead(case, plan, preemptor, chosen, other)):
            for node in sorted({p.node for p in other.placements if p is not None}):
                if not _fits_without(snapshot, preemptor, node, other):
                    continue
                if "preempt" in {e.rule for e in mine} and not _within_share(case, plan, preemptor, other, node):
                    continue
                if other.priority < highest or lost(other, NOW) < total - TOL:
                    found.append(f"evicted {[v.id for v in chosen]} (priority {highest}) losing {total:g} GPU-s; "
                                 f"{other.id} (priority {other.priority}) alone on {node} would have lost "
                                 f"{lost(other, NOW):g}")
    return found


@settings(max_examples=examples(300), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(crowded_cases())
def test_no_set_of_victims_loses_more_than_one_allowed_victim_alone(case):
    wrong = costlier_than_one(case)
    assert not wrong, (wrong, case.policy, case.snapshot)


def test_two_half_gpu_victims_losing_more_than_one_whole_gpu_victim_stay():
    """The set of victims is weighed whole: two half-GPU jobs that lose 10 GPU-s each, the cheapest victims
    one by one, together lose more than the one whole-GPU job that loses 15 on the other node. (Youngest
    first, the older whole-GPU job stays.)"""
    def half(job_id: str, seq: int) -> JobSpec:
        return JobSpec(id=job_id, project="p", request=TaskRequest(gpus=0.5), priority=50, submitted=0.0,
                       started=10.0, checkpointed=980.0, placements=(TaskPlacement("n1", (0,), 0.5),), seq=seq)
    whole = JobSpec(id="w", project="p", request=TaskRequest(gpus=1.0), priority=50, submitted=0.0, started=0.0,
                    checkpointed=985.0, placements=(TaskPlacement("n2", (0,), 1.0),), seq=3)
    wants = JobSpec(id="wants", project="p", request=TaskRequest(gpus=1.0), priority=75, submitted=NOW, seq=9)
    nodes = (NodeSpec("n1", gpus=1, pool=POOL), NodeSpec("n2", gpus=1, pool=POOL))
    snapshot = Snapshot(nodes, (half("h1", 1), half("h2", 2), whole, wants), NOW)
    for order, victims in ((LEAST_LOST_WORK, ["w"]), (YOUNGEST_FIRST, ["h1", "h2"])):
        policy = Policy(departments={"default": Department("default", implicit=True)},
                        projects={"p": Project("p", quota={POOL: Resources(2.0)})}, min_runtime_s=0.0,
                        victim_order=order)
        plan = schedule(snapshot, policy, PM)
        assert sorted(e.job for e in plan.evictions) == victims, order
        assert [b.job for b in plan.binds] == ["wants"]
        if order == LEAST_LOST_WORK:
            assert not costlier_than_one(Case(policy, snapshot, 1))


def test_a_memory_slice_over_its_share_evicts_what_it_takes_of_the_larger_gpu():
    """A 20 GiB slice takes half a 40 GiB GPU but a quarter of an 80 GiB one. Its project holds more than its
    fair share, so its victims must free what the slice will hold where it goes: on the 80 GiB GPU, the
    quarter-GPU job alone (250 GPU-s lost), not a half-GPU job on the 40 GiB GPU (500)."""
    def running(job_id: str, node: str, share: float, seq: int) -> JobSpec:
        return JobSpec(id=job_id, project="p", request=TaskRequest(gpus=share), priority=25, submitted=0.0,
                       started=0.0, placements=(TaskPlacement(node, (0,), share),), seq=seq)
    jobs = (running("a", "small", 0.5, 1), running("b", "small", 0.5, 2), running("quarter", "large", 0.25, 3),
            running("most", "large", 0.75, 4))
    wants = JobSpec(id="wants", project="p", request=TaskRequest(gpus=0.0, gpu_memory_gib=20.0), priority=75,
                    submitted=NOW, seq=9)
    nodes = (NodeSpec("small", gpus=1, gpu_memory_gib=40.0, pool=POOL),
             NodeSpec("large", gpus=1, gpu_memory_gib=80.0, pool=POOL))
    policy = Policy(departments={"default": Department("default", implicit=True)},
                    projects={"p": Project("p", quota={POOL: Resources(0.0)}, over_quota_weight=0.0)},
                    min_runtime_s=0.0, victim_order=LEAST_LOST_WORK)
    snapshot = Snapshot(nodes, (*jobs, wants), NOW)
    plan = schedule(snapshot, policy, PM)
    assert [e.job for e in plan.evictions] == ["quarter"]
    assert [(b.job, b.placement.node, b.placement.gpu_share) for b in plan.binds] == [("wants", "large", 0.25)]
    assert not costlier_than_one(Case(policy, snapshot, 1))
