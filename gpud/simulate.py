"""Running the real scheduling core on a scenario, in memory, and checking what it expects."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Mapping

import pluggy

from gpud.core import Scheduler
from gpud.model import EPS, Eviction, JobSpec, Plan, Snapshot
from gpud.reasons import eviction_text, waiting_text
from gpud.scenario import Expectations, Scenario


@dataclass
class Simulation:
    """What the cycles did: the final snapshot, every plan, and the jobs evicted or moved."""

    snapshot: Snapshot
    plans: list[Plan] = field(default_factory=list)
    preempted: set[str] = field(default_factory=set)
    evictions: list[tuple[int, Eviction]] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)
    # In simulated time (``Scenario.until``): when each job started (its last start), the start each
    # pending job was first planned for, the jobs that ended, and the clock of each plan.
    started: dict[str, float] = field(default_factory=dict)
    first_estimates: dict[str, float] = field(default_factory=dict)
    reserved: dict[str, float] = field(default_factory=dict)
    finished: set[str] = field(default_factory=set)
    times: list[float] = field(default_factory=list)

    @property
    def last_plan(self) -> Plan:
        """The plan of the last cycle run."""
        return self.plans[-1]

    def running(self) -> set[str]:
        """Jobs with at least one task placed after the last cycle."""
        return {job.id for job in self.snapshot.jobs if job.is_running}

    def pending(self) -> set[str]:
        """Jobs with no task placed after the last cycle."""
        return {job.id for job in self.snapshot.jobs if not job.is_running}


def apply_plan(snapshot: Snapshot, plan: Plan) -> Snapshot:
    """The snapshot after a plan is carried out (evictions first, then binds), at the same instant."""
    changes: dict[str, list] = {}
    jobs = {job.id: job for job in snapshot.jobs}

    def slots(job_id: str) -> list:
        if job_id not in changes:
            job = jobs[job_id]
            changes[job_id] = [job.task_placement(i) for i in range(job.tasks)]
        return changes[job_id]

    for eviction in plan.evictions:
        for task in eviction.tasks:
            slots(eviction.job)[task] = None
    for bind in plan.binds:
        slots(bind.job)[bind.task] = bind.placement
    updated = []
    for job in snapshot.jobs:
        if job.id not in changes:
            updated.append(job)
            continue
        placements = tuple(changes[job.id])
        running = any(p is not None for p in placements)
        started = job.started if job.is_running and running else (snapshot.now if running else None)
        updated.append(dataclasses.replace(job, placements=placements, started=started))
    return dataclasses.replace(snapshot, jobs=tuple(updated))


def simulate(scenario: Scenario, pm: pluggy.PluginManager) -> Simulation:
    """Run the scenario's cycles, then its stable cycles, checking [expect] after the last cycle and each stable one
    (in simulated time when the scenario has ``until``: see ``simulate_timed``)."""
    if scenario.until is not None:
        return simulate_timed(scenario, pm)
    sim = Simulation(scenario.snapshot)
    scheduler = Scheduler(scenario.snapshot, scenario.policy, pm)
    total = scenario.cycles + scenario.stable_cycles
    for cycle in range(1, total + 1):
        plan = scheduler.cycle()
        sim.snapshot = dataclasses.replace(sim.snapshot, jobs=scheduler.jobs())
        sim.plans.append(plan)
        still_running = sim.running()
        for eviction in plan.evictions:
            sim.evictions.append((cycle, eviction))
            if eviction.moved or eviction.job not in still_running:
                sim.preempted.add(eviction.job)
        if scenario.expect is not None and cycle >= scenario.cycles:
            failures = check(scenario.expect, sim)
            if failures:
                sim.failures = [f"after cycle {cycle}: {f}" for f in failures]
                break
    return sim


def simulate_timed(scenario: Scenario, pm: pluggy.PluginManager) -> Simulation:
    """Run the scenario in simulated time, checking [expect] at the end.

    Jobs join at their ``submitted`` time; a running job ends after its
    ``runtime`` or at its time limit, whichever comes first (a job with
    neither runs on). A cycle runs at the first instant and at every
    submission or end after it, until the next would be after ``until``.
    """
    assert scenario.until is not None
    snapshot, until = scenario.snapshot, scenario.until
    now = snapshot.now
    future = sorted((j for j in snapshot.jobs if j.submitted > now), key=lambda j: (j.submitted, j.seq))
    first = tuple(j for j in snapshot.jobs if j.submitted <= now)
    sim = Simulation(dataclasses.replace(snapshot, jobs=first))
    scheduler = Scheduler(sim.snapshot, scenario.policy, pm)
    ends: dict[str, float] = {}
    for job in first:
        if job.is_running and job.started is not None:
            sim.started[job.id] = job.started
            ends[job.id] = _end(job, job.started, scenario.runtimes)
    at = 0
    cycle = 0
    while True:
        while at < len(future) and future[at].submitted <= now:
            scheduler.submit(future[at])
            at += 1
        for job_id in [j for j, end in ends.items() if end <= now]:
            scheduler.finish(job_id)
            sim.finished.add(job_id)
            del ends[job_id]
        cycle += 1
        plan = scheduler.cycle(now)
        sim.plans.append(plan)
        sim.times.append(now)
        running_before = set(ends)
        for job in scheduler.jobs():
            if job.is_running and job.id not in running_before:
                sim.started[job.id] = now
                ends[job.id] = _end(job, now, scenario.runtimes)
            elif not job.is_running and job.id in ends:
                del ends[job.id]
        for eviction in plan.evictions:
            sim.evictions.append((cycle, eviction))
            if eviction.moved or eviction.job not in ends:
                sim.preempted.add(eviction.job)
        for job_id, reservation in plan.reservations.items():
            sim.first_estimates.setdefault(job_id, reservation.estimate)
            if reservation.holds:
                sim.reserved.setdefault(job_id, reservation.start)
        upcoming = [future[at].submitted] if at < len(future) else []
        upcoming += [end for end in ends.values() if end > now]
        if not upcoming or min(upcoming) > until:
            break
        now = min(upcoming)
    sim.snapshot = dataclasses.replace(snapshot, jobs=scheduler.jobs(), now=now)
    if scenario.expect is not None:
        sim.failures = [f"at {now:g} s: {f}" for f in check(scenario.expect, sim)]
    return sim


def _end(job: JobSpec, started: float, runtimes: Mapping[str, float]) -> float:
    """When a job started at ``started`` ends: after its run time, or at its time limit if sooner."""
    runtime = runtimes.get(job.id, math.inf)
    limit = job.time_limit if job.time_limit is not None else math.inf
    return started + min(runtime, limit)


def _names(values) -> str:
    return "[" + ", ".join(sorted(values)) + "]" if values else "[]"


def _queue_total(plan: Plan, name: str, attribute: str) -> float | None:
    for kind in ("project", "department"):
        reports = [q for q in plan.queues if q.name == name and q.kind == kind]
        if reports:
            return sum(getattr(q, attribute).gpu for q in reports)
    return None


def check(expect: Expectations, sim: Simulation) -> list[str]:
    """Every expectation that does not hold, each saying what was expected and what happened."""
    failures = []
    for label, wanted, found in (("running", expect.running, sim.running()),
                                 ("pending", expect.pending, sim.pending()),
                                 ("preempted", expect.preempted, sim.preempted)):
        if wanted is not None and set(wanted) != found:
            failures.append(f"{label}: expected {_names(wanted)}, got {_names(found)}")
    jobs = {job.id: job for job in sim.snapshot.jobs}
    for job_id, nodes in (expect.placement or {}).items():
        nodes_now = tuple(p.node if p else "" for p in (jobs[job_id].task_placement(i)
                                                       for i in range(jobs[job_id].tasks)))
        if tuple(nodes) != nodes_now:
            failures.append(f"placement of {job_id}: expected {list(nodes)}, got {list(nodes_now)}")
    for job_id, indices in (expect.gpu_index or {}).items():
        gpus_now = tuple(tuple(p.gpu_index) if p else () for p in (jobs[job_id].task_placement(i)
                                                                    for i in range(jobs[job_id].tasks)))
        if tuple(tuple(i) for i in indices) != gpus_now:
            failures.append(f"gpu_index of {job_id}: expected {[list(i) for i in indices]}, "
                            f"got {[list(i) for i in gpus_now]}")
    for job_id, count in (expect.running_tasks or {}).items():
        tasks_now = jobs[job_id].running_tasks
        if tasks_now != count:
            failures.append(f"running_tasks of {job_id}: expected {count}, got {tasks_now}")
    if expect.finished is not None and set(expect.finished) != sim.finished:
        failures.append(f"finished: expected {_names(expect.finished)}, got {_names(sim.finished)}")
    for label, wanted_times, found_times in (("started", expect.started, sim.started),
                                             ("estimated_start", expect.estimated_start, sim.first_estimates)):
        for job_id, when in (wanted_times or {}).items():
            got = found_times.get(job_id)
            if got is None or abs(got - when) > 1e-6:
                failures.append(f"{label} of {job_id}: expected {when:g}, got "
                                f"{'none' if got is None else format(got, 'g')}")
    for name, gpus in (expect.project_gpus or {}).items():
        allocated = _queue_total(sim.last_plan, name, "allocated") or 0.0
        if abs(allocated - gpus) > 1e-6:
            failures.append(f"project_gpus of {name}: expected {gpus:g}, got {allocated:g}")
    for name, share in (expect.fair_share or {}).items():
        fair = _queue_total(sim.last_plan, name, "fair_share") or 0.0
        if abs(fair - share) > 0.01 + EPS:
            failures.append(f"fair_share of {name}: expected {share:g}, got {fair:.4f}")
    return failures


def job_rows(sim: Simulation) -> list[dict]:
    """One dict per job after the last cycle: state, project, nodes, GPUs and why it waits."""
    reasons = sim.last_plan.pending
    rows = []
    for job in sorted(sim.snapshot.jobs, key=lambda j: (j.seq, j.id)):
        placements = [job.task_placement(i) for i in range(job.tasks)]
        rows.append({
            "job": job.id,
            "project": job.project,
            "priority": job.priority,
            "state": "running" if job.is_running else "pending",
            "tasks_running": job.running_tasks,
            "tasks": job.tasks,
            "nodes": [p.node if p else "" for p in placements],
            "gpu_index": [list(p.gpu_index) if p else [] for p in placements],
            "reason": waiting_text(reasons[job.id]) if job.id in reasons else None,
        })
    return rows


def queue_rows(sim: Simulation) -> list[dict]:
    """One dict per queue in the last cycle: allocated GPUs, quota and fair share, by pool."""
    return [{"queue": q.name, "kind": q.kind, "pool": q.pool, "department": q.department,
             "allocated_gpus": round(q.allocated.gpu, 6), "quota_gpus": round(q.quota.gpu, 6),
             "fair_share_gpus": round(q.fair_share.gpu, 6), "demand_gpus": round(q.demand.gpu, 6),
             "allocated_cpus": round(q.allocated.cpu, 6), "fair_share_cpus": round(q.fair_share.cpu, 6)}
            for q in sim.last_plan.queues]


def eviction_rows(sim: Simulation) -> list[dict]:
    """One dict per eviction or move, in the order the cycles made them."""
    return [{"cycle": cycle, "job": e.job, "tasks": list(e.tasks), "moved": e.moved, "rule": e.rule,
             "for_job": e.for_job, "reason": eviction_text(e.why) if e.why is not None else ""}
            for cycle, e in sim.evictions]
