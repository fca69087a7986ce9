"""Invariants of the scheduling core over random small clusters (hypothesis).

Snapshots and policies are built directly from gpud.model and gpud.policy. Running jobs in a
generated snapshot are placed consistently (no GPU shared beyond 1, no node over its CPUs or
memory, gangs at or above their minimum), so every violation found is the scheduler's.
"""

from __future__ import annotations

import dataclasses

from collections import defaultdict
from dataclasses import dataclass
from unittest import mock

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis_budget import examples

from gpud.core import COMPILED, schedule
from gpud.core.evict import VictimLists
from gpud.core.nodes import NodeIndex
from gpud.core.victims_by_node import VictimsByNode
from gpud.model import EPS, JobSpec, NodeSpec, Plan, Resources, Snapshot, TaskPlacement, TaskRequest
from gpud.plugins import make_plugin_manager
from gpud.policy import Department, Policy, Project
from gpud.simulate import apply_plan
from gpud.reasons import pending_texts

POOL = "default"
NOW = 1000.0
TOL = 1e-6
PM = make_plugin_manager()
SETTINGS = settings(max_examples=examples(80), deadline=None, suppress_health_check=[HealthCheck.too_slow])


@dataclass
class Case:
    policy: Policy
    snapshot: Snapshot
    cycles: int


# --- generating clusters ------------------------------------------------------------------------

@st.composite
def nodes(draw) -> list[NodeSpec]:
    count = draw(st.integers(1, 4))
    return [NodeSpec(name=f"n{i}", gpus=draw(st.integers(1, 8)),
                     gpu_memory_gib=draw(st.sampled_from([40.0, 80.0])),
                     cpus=float(draw(st.integers(2, 32))), memory_gib=float(draw(st.integers(8, 128))),
                     pool=POOL)
            for i in range(1, count + 1)]


@st.composite
def policies(draw) -> Policy:
    """1-3 projects with GPU quotas (and sometimes CPU and memory quotas) and weights, optionally in departments.

    A department's quota is at least the sum of its projects' quotas, so no project's deserved
    quota is scaled down: "at or below its quota" then means the same at both levels.
    """
    count = draw(st.integers(1, 3))
    use_departments = draw(st.booleans())
    host_quotas = draw(st.booleans())
    projects, members = {}, defaultdict(list)
    for i in range(1, count + 1):
        department = draw(st.sampled_from(["D1", "D2", "default"])) if use_departments else "default"
        quota = Resources(float(draw(st.integers(0, 6))),
                          float(draw(st.integers(1, 16))) if host_quotas else 0.0,
                          float(draw(st.integers(1, 64))) if host_quotas else 0.0)
        projects[f"p{i}"] = Project(
            name=f"p{i}", quota={POOL: quota},
            over_quota_weight=float(draw(st.integers(0, 3))),
            over_quota_priority=draw(st.sampled_from([0, 0, 0, 10])),
            over_quota=draw(st.sampled_from([True, True, True, False])),
            department=department)
        members[department].append(quota)
    departments = {}
    for name, quotas in members.items():
        if name == "default":
            departments[name] = Department(name, implicit=True)
        else:
            extra = Resources(*(float(draw(st.integers(0, 3))) for _ in range(3)))
            departments[name] = Department(name, quota={POOL: sum(quotas, Resources()) + extra},
                                           over_quota_weight=float(draw(st.integers(0, 2))))
    placement = draw(st.sampled_from(["binpack", "spread"]))
    return Policy(departments=departments, projects=projects,
                  over_quota_weights=draw(st.booleans()),
                  min_runtime_s=draw(st.sampled_from([0.0, 0.0, 300.0])),
                  placement=placement, cpu_placement=placement,
                  gpu_placement=draw(st.sampled_from([None, "binpack", "spread"])))


@st.composite
def requests(draw) -> TaskRequest:
    kind = draw(st.sampled_from(["whole", "whole", "fraction", "memory", "cpu"]))
    cpus = float(draw(st.integers(0, 4)))
    memory = float(draw(st.integers(0, 16)))
    if kind == "whole":
        return TaskRequest(gpus=float(draw(st.integers(1, 4))), cpus=cpus, memory_gib=memory)
    if kind == "fraction":
        return TaskRequest(gpus=draw(st.sampled_from([0.25, 0.5, 0.75])), cpus=cpus, memory_gib=memory)
    if kind == "memory":
        return TaskRequest(gpus=0.0, gpu_memory_gib=float(draw(st.sampled_from([10, 20, 40, 60]))),
                           cpus=cpus, memory_gib=memory)
    return TaskRequest(gpus=0.0, cpus=float(draw(st.integers(1, 8))), memory_gib=memory)


class Room:
    """Free capacity of the generated nodes while running tasks are placed."""

    def __init__(self, specs: list[NodeSpec]) -> None:
        self.specs = {n.name: n for n in specs}
        self.share = {n.name: [1.0] * n.gpus for n in specs}
        self.cpu = {n.name: n.cpus for n in specs}
        self.mem = {n.name: n.memory_gib for n in specs}

    def take(self, node: str, request: TaskRequest) -> TaskPlacement | None:
        spec = self.specs[node]
        if request.cpus > self.cpu[node] + EPS or request.memory_gib > self.mem[node] + EPS:
            return None
        free = self.share[node]
        if not request.uses_gpu:
            placement = TaskPlacement(node, (), 0.0)
        elif request.is_shared:
            if request.gpu_memory_gib is not None and request.gpu_memory_gib > spec.gpu_memory_gib:
                return None
            share = request.gpu_share_on(spec.gpu_memory_gib)
            fits = [i for i, f in enumerate(free) if f >= share - EPS]
            if not fits:
                return None
            placement = TaskPlacement(node, (fits[0],), share)
        else:
            whole = [i for i, f in enumerate(free) if f >= 1.0 - EPS][:request.whole_gpus]
            if len(whole) < request.whole_gpus:
                return None
            placement = TaskPlacement(node, tuple(whole), 1.0)
        for i in placement.gpu_index:
            free[i] -= placement.gpu_share
        self.cpu[node] -= request.cpus
        self.mem[node] -= request.memory_gib
        return placement


@st.composite
def cases(draw) -> Case:
    policy = draw(policies())
    specs = draw(nodes())
    room = Room(specs)
    jobs = []
    for seq in range(draw(st.integers(0, 10))):
        request = draw(requests())
        tasks = draw(st.integers(1, 3))
        min_tasks = draw(st.one_of(st.none(), st.integers(1, tasks)))
        job = JobSpec(id=f"j{seq}", project=draw(st.sampled_from(sorted(policy.projects))), request=request,
                      priority=draw(st.sampled_from([50, 50, 75, 100, 125])), tasks=tasks, min_tasks=min_tasks,
                      submitted=float(draw(st.integers(0, 500))), seq=seq, placements=(None,) * tasks)
        if draw(st.booleans()):
            minimum = job.gang_minimum
            want = draw(st.integers(minimum, tasks))
            placements = []
            for _ in range(want):
                placement = room.take(draw(st.sampled_from(sorted(room.specs))), request)
                if placement is None:
                    break
                placements.append(placement)
            if len(placements) >= minimum:
                placements += [None] * (tasks - len(placements))
                started = float(draw(st.integers(int(job.submitted), int(NOW))))
                job = dataclasses.replace(job, placements=tuple(placements), started=started)
            else:  # give back what a gang that could not start took
                for placement in placements:
                    for i in placement.gpu_index:
                        room.share[placement.node][i] += placement.gpu_share
                    room.cpu[placement.node] += request.cpus
                    room.mem[placement.node] += request.memory_gib
        jobs.append(job)
    return Case(policy, Snapshot(tuple(specs), tuple(jobs), NOW), draw(st.integers(1, 3)))



# --- reading snapshots and plans ----------------------------------------------------------------

def project_alloc(snapshot: Snapshot, only=lambda job: True) -> dict[str, Resources]:
    """What each project's running tasks hold."""
    held: dict[str, Resources] = defaultdict(Resources)
    for job in snapshot.jobs:
        if not only(job):
            continue
        for p in job.placements:
            if p is not None:
                held[job.project] += Resources(p.gpu_share * len(p.gpu_index), job.request.cpus,
                                               job.request.memory_gib)
    return held


def department_total(policy: Policy, per_project: dict[str, Resources], department: str) -> Resources:
    return sum((r for name, r in per_project.items() if policy.projects[name].department == department),
               Resources())


def run_cycles(case: Case, cycles: int):
    """Yield (before, plan, after) for each cycle, the clock standing still."""
    snapshot = case.snapshot
    for _ in range(cycles):
        plan = schedule(snapshot, case.policy, PM)
        after = apply_plan(snapshot, plan)
        yield snapshot, plan, after
        snapshot = after


# A test that replaces a method of the core to undo a shortcut: a compiled core calls its own methods
# directly, so the replacement would not be used and the test would check nothing there.
python_core_only = pytest.mark.skipif(COMPILED, reason="a compiled core's methods cannot be replaced from outside")


def assert_plans_unchanged_with(case: Case, owner: type, name: str, replacement: object) -> None:
    """Every cycle's plan, made again with ``owner.name`` replaced (a shortcut of the core undone), has the
    very same binds, evictions and reasons."""
    for before, plan, _ in run_cycles(case, case.cycles):
        with mock.patch.object(owner, name, replacement):
            again = schedule(before, case.policy, PM)
        assert (again.binds, again.evictions, dict(pending_texts(again))) == (
            plan.binds, plan.evictions, dict(pending_texts(plan)))


def assert_not_overcommitted(snapshot: Snapshot) -> None:
    specs = {n.name: n for n in snapshot.nodes}
    share = {n.name: [0.0] * n.gpus for n in snapshot.nodes}
    cpu, mem = defaultdict(float), defaultdict(float)
    for job in snapshot.jobs:
        r = job.request
        for task, p in enumerate(job.placements):
            if p is None:
                continue
            spec = specs[p.node]
            cpu[p.node] += r.cpus
            mem[p.node] += r.memory_gib
            assert len(set(p.gpu_index)) == len(p.gpu_index), f"{job.id}/{task} holds a GPU twice: {p}"
            if not r.uses_gpu:
                assert p.gpu_index == (), f"CPU-only {job.id}/{task} holds GPUs: {p}"
            elif r.is_shared:
                assert len(p.gpu_index) == 1
                assert abs(p.gpu_share - r.gpu_share_on(spec.gpu_memory_gib)) < TOL, f"{job.id}: {p}"
            else:
                assert len(p.gpu_index) == r.whole_gpus and p.gpu_share == 1.0, f"{job.id}: {p}"
            for i in p.gpu_index:
                assert 0 <= i < spec.gpus, f"{job.id}/{task} on GPU {i} of {spec.name} ({spec.gpus} GPUs)"
                share[p.node][i] += p.gpu_share
    for name, used in share.items():
        assert all(u <= 1 + TOL for u in used), f"node {name} GPUs over-committed: {used}"
        assert cpu[name] <= specs[name].cpus + TOL, f"node {name}: {cpu[name]} CPUs of {specs[name].cpus}"
        assert mem[name] <= specs[name].memory_gib + TOL, f"node {name}: {mem[name]} GiB of memory"


def changed(plan: Plan) -> bool:
    return bool(plan.binds or plan.evictions)


# --- properties ---------------------------------------------------------------------------------

@SETTINGS
@given(cases())
def test_no_node_or_gpu_is_ever_overcommitted(case):
    assert_not_overcommitted(case.snapshot)  # the generator's own promise
    for _, _, after in run_cycles(case, case.cycles):
        assert_not_overcommitted(after)


@SETTINGS
@given(cases())
def test_every_waiting_job_says_why(case):
    for _, plan, after in run_cycles(case, case.cycles):
        waiting = {job.id for job in after.jobs if job.running_tasks < job.tasks}
        for job_id in waiting:
            reason = pending_texts(plan)[job_id]
            assert reason and "not considered" not in reason, f"{job_id}: {reason!r}"


@SETTINGS
@given(cases())
def test_gangs_run_whole_or_not_at_all(case):
    for _, _, after in run_cycles(case, case.cycles):
        for job in after.jobs:
            assert job.running_tasks == 0 or job.running_tasks >= job.gang_minimum, (
                f"{job.id} runs {job.running_tasks} of {job.tasks} tasks (minimum {job.gang_minimum})")


@SETTINGS
@given(cases())
def test_non_preemptible_jobs_are_never_evicted_nor_moved(case):
    for before, plan, _ in run_cycles(case, case.cycles):
        jobs = {j.id: j for j in before.jobs}
        for eviction in plan.evictions:
            assert jobs[eviction.job].preemptible, f"non-preemptible {eviction.job} evicted: {eviction}"


@SETTINGS
@given(cases())
def test_non_preemptible_jobs_start_only_within_quota(case):
    # A non-preemptible job that starts with GPUs leaves its project and department within their GPU
    # quota, counting every non-preemptible job (they are never evicted, so any that ran over quota
    # before the cycle would have blocked this one).
    policy = case.policy
    for before, plan, after in run_cycles(case, case.cycles):
        jobs = {j.id: j for j in before.jobs}
        moved = {e.job for e in plan.evictions if e.moved}
        started = [jobs[b.job] for b in plan.binds if b.job not in moved]
        held = project_alloc(after, only=lambda job: not job.preemptible)
        for project in {job.project for job in started if not job.preemptible and job.request.uses_gpu}:
            quota = policy.projects[project].quota_in(POOL).gpu
            assert held[project].gpu <= quota + TOL, (
                f"project {project} holds {held[project].gpu:g} non-preemptible GPUs, quota {quota:g}")
            department = policy.departments[policy.projects[project].department]
            if not department.implicit:
                total = department_total(policy, held, department.name).gpu
                limit = department.quota_in(POOL).gpu
                assert total <= limit + TOL, (
                    f"department {department.name} holds {total:g} non-preemptible GPUs, quota {limit:g}")


@SETTINGS
@given(cases())
def test_reclaim_never_takes_from_a_queue_at_or_below_its_quota(case):
    # The victim's project must be above its quota in some resource, counting what it held before the
    # cycle plus what the same cycle gave it before reclaim ran (allocation comes first). A CPU or
    # memory quota that is not set is not enforced, so it is never exceeded.
    policy = case.policy
    for before, plan, _ in run_cycles(case, case.cycles):
        jobs = {j.id: j for j in before.jobs}
        held = project_alloc(before)
        moved = {e.job for e in plan.evictions if e.moved}
        for bind in plan.binds:
            job = jobs[bind.job]
            if bind.job not in moved and job.task_placement(bind.task) is None:
                p = bind.placement
                held[job.project] += Resources(p.gpu_share * len(p.gpu_index), job.request.cpus,
                                               job.request.memory_gib)
        for eviction in plan.evictions:
            if eviction.rule != "reclaim":
                continue
            project = jobs[eviction.job].project
            written = policy.projects[project].quota_in(POOL)
            quota = Resources(written.gpu, written.cpu or float("inf"), written.memory or float("inf"))
            assert any(held[project].get(r) > quota.get(r) + TOL for r in ("gpu", "cpu", "memory")), (
                f"reclaim took {eviction.job} from project {project} holding at most {held[project]} "
                f"of quota {quota}: {eviction.why}")


@SETTINGS
@given(cases())
def test_reclaimer_never_ends_above_its_fair_share(case):
    # Preemption runs after reclaim in the same cycle; it may reorder the reclaimer's project but never
    # takes it over its fair share, so the project still ends within it.
    for before, plan, after in run_cycles(case, case.cycles):
        jobs = {j.id: j for j in before.jobs}
        reclaimers = {e.for_job for e in plan.evictions if e.rule == "reclaim"}
        held = project_alloc(after)
        shares = {q.name: q for q in plan.queues if q.kind == "project"}
        for job_id in reclaimers:
            job = jobs[job_id]
            share = shares[job.project].fair_share
            need = Resources(1.0 if job.request.uses_gpu else 0.0, job.request.cpus, job.request.memory_gib)
            for r in ("gpu", "cpu", "memory"):
                if need.get(r) > 0:
                    assert held[job.project].get(r) <= share.get(r) + TOL, (
                        f"reclaimer {job_id} left project {job.project} with {held[job.project].get(r):g} "
                        f"{r}, fair share {share.get(r):g}")


@settings(max_examples=examples(60), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cases())
def test_a_converged_cluster_stays_put(case):
    cycles = list(run_cycles(case, 11))
    quiet = next((n for n, (_, plan, _) in enumerate(cycles[:10]) if not changed(plan)), None)
    assert quiet is not None, "no cycle of the first 10 left the cluster unchanged: " + "; ".join(
        f"cycle {n + 1}: {len(p.binds)} binds, {[(e.job, e.rule) for e in p.evictions]}"
        for n, (_, p, _) in enumerate(cycles[:10]))
    _, next_plan, _ = cycles[quiet + 1]
    assert not changed(next_plan), f"cycle {quiet + 2} changed a converged cluster: {next_plan}"


def _every_node_holds_all(self, queue, priority):
    """Node sums that rule out no node: the victims hold everything everywhere. Made from no list of
    victims, they give none by node, and the search walks the whole list."""
    everything = VictimsByNode([], {})
    everything.held = {name: (float("inf"),) * 3 for name in self.state.nodes}
    return everything


@python_core_only
@SETTINGS
@given(cases())
def test_what_preemption_sums_up_by_node_never_changes_a_plan(case):
    # Before it tries, preemption sums up what the victims hold on each node, and passes over the
    # nodes (or the whole try) where they cannot free what the fair share asks back. Sums that rule
    # out nothing must give the very same plans: the sums only save searches that would fail.
    assert_plans_unchanged_with(case, VictimLists, "holdings", _every_node_holds_all)


@python_core_only
def test_a_job_that_may_preempt_no_victim_keeps_allocations_reason_with_sums_by_node_or_without():
    """Jobs of one request at priorities 75 and 50 share a group; the one victim runs at 50. Whether the
    75 is passed over for what an earlier job's victims could not free (the sums by node) or tries and
    fails, the 50 behind it may preempt nothing: it keeps the reason allocation gave. And the 75, told
    what the earlier job (which also asked for memory) met, hears of the GPUs alone, as its own try says."""
    policy = Policy(departments={"default": Department("default", implicit=True)},
                    projects={"p1": Project("p1", quota={POOL: Resources(0.0)}, over_quota_weight=0.0)},
                    min_runtime_s=0.0)
    def request(gpus: float, memory_gib: float = 0.0) -> TaskRequest:
        return TaskRequest(gpus=gpus, cpus=0.0, memory_gib=memory_gib)
    running = JobSpec("j0", "p1", request(0.25), priority=50, started=0.0,
                      placements=(TaskPlacement("n1", (0,), 0.25),), seq=0)
    with_memory = JobSpec("j1", "p1", request(1.0, memory_gib=1.0), priority=75, seq=1)
    low = [JobSpec(f"j{i}", "p1", request(1.0), priority=50, seq=i) for i in (2, 3, 4)]
    high = JobSpec("j5", "p1", request(1.0), priority=75, seq=5)
    snapshot = Snapshot((NodeSpec("n1", gpus=1, cpus=2.0, memory_gib=8.0, pool=POOL),),
                        (running, with_memory, *low, high), NOW)
    texts = dict(pending_texts(schedule(snapshot, policy, PM)))
    assert "waiting for GPUs" in texts["j2"]
    assert "GiB memory" not in texts["j5"] and "within its fair share" in texts["j5"]
    assert_plans_unchanged_with(Case(policy, snapshot, 1), VictimLists, "holdings", _every_node_holds_all)


def _picked_out_anew(self, queue, priority):
    """The victims of ``queue`` below ``priority`` that run now, picked out of the whole list at every call."""
    placements, touched = self.state.placements, self.state.touched
    return [entry[2] for entry in self.ordered(queue) if entry[2].job.priority < priority
            and (entry[2].job.id not in touched or any(placements[entry[2].job.id]))]


@python_core_only
@SETTINGS
@given(cases())
def test_victims_picked_out_once_per_action_give_the_plans_of_a_list_made_anew(case):
    # Preemption picks a queue's victims below a priority out of its list once per action; a job
    # stopped since is passed over where it is read. The victims that run now, picked out anew at
    # every try, must give the very same plans.
    assert_plans_unchanged_with(case, VictimLists, "running_below", _picked_out_anew)



_update = NodeIndex.update


def _update_and_sort(self, node, gpus=None):
    """``NodeIndex.update`` with the lists by leftover sorted again at once, as at every change."""
    _update(self, node, gpus)
    self.sort_fits()


@python_core_only
@SETTINGS
@given(cases())
def test_lists_by_leftover_sorted_when_read_give_the_plans_of_lists_sorted_at_every_change(case):
    # Best fit's lists of nodes by leftover are sorted when read, not at every bind and eviction. Lists
    # sorted again at every change must give the very same plans.
    assert_plans_unchanged_with(case, NodeIndex, "update", _update_and_sort)
