"""The reservation rule over random clusters of every job shape, in simulated time (hypothesis).

A job that holds a reservation starts no later than the start it was given,
unless a job that outranks it (ahead of it in its queue's order: a higher
priority, or the same priority and submitted before it) started (or, evicted,
started again) after the reservation was made: such a job may start sooner than planned, where it
fits then. No job behind it, however small or short, delays it.
"""

from __future__ import annotations

import dataclasses
import math

from hypothesis import HealthCheck, given, note, settings
from hypothesis import strategies as st
from hypothesis_budget import examples

from gpud.core import Scheduler
from gpud.model import JobSpec, NodeSpec, Resources, Snapshot, TaskRequest
from gpud.plugins import make_plugin_manager
from gpud.policy import Department, Policy, Project, Reservations

POOL = "default"
PM = make_plugin_manager()
LIMITS = [30.0, 60.0, 100.0, 250.0, 600.0]
EPOCH = 1.7e9  # times are Unix times, as the controller gives them: an instant plus 1e-9 is the same float


@st.composite
def requests(draw) -> TaskRequest:
    kind = draw(st.sampled_from(["whole", "whole", "whole", "fraction", "memory", "cpu"]))
    cpus = float(draw(st.integers(0, 4)))
    memory = float(draw(st.integers(0, 16)))
    if kind == "whole":
        return TaskRequest(gpus=float(draw(st.integers(1, 4))), cpus=cpus, memory_gib=memory)
    if kind == "fraction":
        return TaskRequest(gpus=draw(st.sampled_from([0.25, 0.5, 0.75])), cpus=cpus, memory_gib=memory)
    if kind == "memory":
        return TaskRequest(gpus=0.0, gpu_memory_gib=float(draw(st.sampled_from([10, 20, 40]))), cpus=cpus,
                       memory_gib=memory)
    return TaskRequest(gpus=0.0, cpus=float(draw(st.integers(1, 8))), memory_gib=memory)


@st.composite
def timed_cases(draw):
    """A policy of one project (in a department or not), 1-3 nodes and up to 14 jobs of every shape,
    each with a time limit and a run time at most that limit, submitted over the first 300 seconds."""
    department = draw(st.sampled_from(["default", "research"]))
    departments = {department: Department(department, implicit=department == "default",
                                          quota={POOL: Resources(64.0, 0.0, 0.0)} if department != "default" else {})}
    policy = Policy(departments=departments, projects={"p": Project("p", department=department)},
                    min_runtime_s=0.0, reservations=Reservations(jobs=draw(st.integers(1, 4))),
                    placement=draw(st.sampled_from(["binpack", "spread"])))
    nodes = tuple(NodeSpec(f"n{i}", gpus=draw(st.integers(1, 8)), gpu_memory_gib=80.0,
                           cpus=float(draw(st.integers(4, 32))), memory_gib=float(draw(st.integers(16, 128))))
                  for i in range(draw(st.integers(1, 3))))
    jobs, runtimes = [], {}
    for seq in range(draw(st.integers(1, 14))):
        tasks = draw(st.integers(1, 3))
        limit = draw(st.sampled_from(LIMITS))
        job = JobSpec(f"j{seq}", "p", draw(requests()), priority=draw(st.sampled_from([50, 50, 50, 75])),
                      tasks=tasks, min_tasks=draw(st.one_of(st.none(), st.integers(1, tasks))),
                      submitted=EPOCH + draw(st.integers(0, 300)), seq=seq, time_limit=limit,
                      placements=(None,) * tasks)
        jobs.append(job)
        runtimes[job.id] = float(draw(st.integers(1, int(limit))))
    return policy, nodes, jobs, runtimes


def replay(policy: Policy, nodes: tuple[NodeSpec, ...], jobs: list[JobSpec], runtimes: dict[str, float],
           until: float = EPOCH + 3000.0):
    """Run the scheduler in simulated time: (first holding reservation of each job and when it was made,
    the first start of each job, every start of each job)."""
    future = sorted(jobs, key=lambda j: (j.submitted, j.seq))
    scheduler = Scheduler(Snapshot(nodes, (), EPOCH), policy, PM)
    now, at, again = EPOCH, 0, 0
    ends: dict[str, float] = {}
    reserved: dict[str, tuple[float, float]] = {}
    started: dict[str, float] = {}
    starts: dict[str, list[float]] = {}
    while True:
        while at < len(future) and future[at].submitted <= now:
            scheduler.submit(future[at])
            at += 1
        for job_id in [j for j, end in ends.items() if end <= now]:
            scheduler.finish(job_id)
            del ends[job_id]
        plan = scheduler.cycle(now)
        for job in scheduler.jobs():
            if job.is_running and job.id not in ends:
                started.setdefault(job.id, now)
                starts.setdefault(job.id, []).append(now)  # an evicted job starts again
                ends[job.id] = now + min(runtimes[job.id], job.time_limit or math.inf)
            elif not job.is_running:
                ends.pop(job.id, None)
        for job_id, reservation in plan.reservations.items():
            if reservation.holds and job_id not in reserved:
                reserved[job_id] = (reservation.start, now)
        # An evicted job's tasks end at once here, and the controller runs a cycle when tasks end: so does this.
        again = again + 1 if plan.evictions and again < 5 else 0
        if again:
            continue
        upcoming = [future[at].submitted] if at < len(future) else []
        upcoming += [end for end in ends.values() if end > now]
        if not upcoming or min(upcoming) > until:
            return reserved, started, starts
        now = min(upcoming)


def outranks(one: JobSpec, other: JobSpec) -> bool:
    """True when ``one`` comes before ``other`` in their project's order (priority, then submission)."""
    return (-one.priority, one.submitted, one.seq) < (-other.priority, other.submitted, other.seq)


@settings(max_examples=examples(150), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(timed_cases())
def test_no_job_holding_a_reservation_starts_later_than_its_reserved_start(case):
    check_reservations_kept(case)


def check_reservations_kept(case) -> None:
    """Replay the case; every job that held a reservation started by its first reserved start, unless a job
    that outranks it started after the reservation was made."""
    policy, nodes, jobs, runtimes = case
    note(f"reservations.jobs={policy.reservations.jobs} resolution={policy.reservations.resolution_s:g} "
         f"placement={policy.placement}")
    for node in nodes:
        note(f"{node.name}: {node.gpus} GPUs, {node.cpus:g} CPUs, {node.memory_gib:g} GiB")
    for job in jobs:
        note(f"{job.id}: {job.request} x{job.tasks} (min {job.min_tasks}) priority {job.priority} submitted "
             f"{job.submitted - EPOCH:g} limit {job.time_limit:g} runs {runtimes[job.id]:g}")
    reserved, started, starts = replay(policy, nodes, jobs, runtimes)
    by_id = {job.id: job for job in jobs}
    for job_id, (start, made_at) in reserved.items():
        job = by_id[job_id]
        if any(outranks(other, job) and any(t >= made_at for t in starts.get(other.id, ())) for other in jobs):
            continue
        assert job_id in started, f"{job_id} reserved for {start:g} s (at {made_at:g} s) never started"
        assert started[job_id] <= start + 1e-6, (
            f"{job_id} reserved for {start - EPOCH:g} s (at {made_at - EPOCH:g} s) started at {started[job_id] - EPOCH:g} s")


def test_the_replay_gives_reservations_and_keeps_them():
    """The property above is not empty: a gang behind a running job holds its start and keeps it."""
    policy = Policy(projects={"p": Project("p")}, departments={"default": Department("default", implicit=True)},
                    min_runtime_s=0.0)
    nodes = (NodeSpec("n1", gpus=8),)
    jobs = [JobSpec("long", "p", TaskRequest(gpus=4), submitted=0, seq=0, time_limit=100),
            JobSpec("gang", "p", TaskRequest(gpus=8), submitted=10, seq=1, time_limit=100)]
    jobs += [JobSpec(f"s{i}", "p", TaskRequest(gpus=1), submitted=20 + i, seq=2 + i, time_limit=300)
             for i in range(4)]
    jobs = [dataclasses.replace(job, submitted=EPOCH + job.submitted) for job in jobs]
    reserved, started, _ = replay(policy, nodes, jobs, {job.id: job.time_limit or 1.0 for job in jobs})
    assert reserved["gang"] == (EPOCH + 100.0, EPOCH + 10.0)
    assert started["gang"] == EPOCH + 100.0
    assert all(started[f"s{i}"] == EPOCH + 200.0 for i in range(4))


def test_a_move_that_restarts_a_job_ahead_counts_against_a_reservation():
    """Consolidation may move a running job to start a job behind a reservation only if the moved job's
    restart (its time limit begins anew) leaves the reservation its start: here moving j0 for j4 would have
    held n1 past j2's start. Found by the property above."""
    policy = Policy(departments={"default": Department("default", implicit=True)}, projects={"p": Project("p")},
                    min_runtime_s=0.0, reservations=Reservations(jobs=1), placement="spread")
    nodes = (NodeSpec("n0", gpus=1, cpus=4.0, memory_gib=16.0), NodeSpec("n1", gpus=6, cpus=4.0, memory_gib=20.0))
    shapes = [  # GPUs and GiB per task, tasks, submitted, time limit, run time
        (1, 10, 2, 0, 600, 301), (1, 0, 3, 8, 250, 202), (2, 6, 2, 1, 30, 1), (2, 0, 2, 8, 60, 60),
        (2, 1, 1, 1, 30, 1), (1, 1, 1, 0, 30, 14), (1, 0, 1, 0, 30, 1), (1, 0, 3, 18, 30, 30),
        (1, 0, 1, 0, 30, 1), (1, 0, 1, 0, 30, 1), (1, 0, 1, 0, 30, 1), (3, 0, 1, 1, 600, 401)]
    jobs = [JobSpec(f"j{seq}", "p", TaskRequest(gpus=float(gpus), cpus=0.0, memory_gib=float(memory)), tasks=tasks,
                    submitted=EPOCH + submitted, seq=seq, time_limit=float(limit), placements=(None,) * tasks)
            for seq, (gpus, memory, tasks, submitted, limit, _) in enumerate(shapes)]
    runtimes = {f"j{seq}": float(shape[5]) for seq, shape in enumerate(shapes)}
    reserved, started, _ = replay(policy, nodes, jobs, runtimes)
    assert reserved["j2"][0] == EPOCH + 700.0
    assert started["j2"] <= EPOCH + 700.0


@st.composite
def draining_cases(draw):
    """Nodes of one size full of 1-GPU jobs that end, early or at their limits, at random times; gangs of whole
    nodes come, then more 1-GPU jobs: reservations choose among nodes that drain, and move as jobs end early."""
    size = draw(st.sampled_from([2, 4]))
    policy = Policy(departments={"default": Department("default", implicit=True)}, projects={"p": Project("p")},
                    min_runtime_s=0.0, reservations=Reservations(jobs=draw(st.integers(1, 3)),
                                                                 resolution_s=draw(st.sampled_from([0.0, 60.0, 300.0]))))
    nodes = tuple(NodeSpec(f"n{i}", gpus=size, cpus=64.0, memory_gib=256.0) for i in range(draw(st.integers(2, 5))))
    jobs, runtimes = [], {}

    def add(name: str, gpus: int, tasks: int, submitted: int, limit: float) -> None:
        job = JobSpec(name, "p", TaskRequest(gpus=float(gpus)), tasks=tasks, submitted=EPOCH + submitted,
                      seq=len(jobs), time_limit=limit, placements=(None,) * tasks)
        jobs.append(job)
        runtimes[name] = float(draw(st.integers(1, int(limit))))
    for i in range(len(nodes) * size):
        add(f"f{i}", 1, 1, 0, draw(st.sampled_from(LIMITS)))
    for i in range(draw(st.integers(1, 3))):
        add(f"g{i}", size, draw(st.integers(1, len(nodes))), draw(st.integers(1, 60)), draw(st.sampled_from(LIMITS)))
    for i in range(draw(st.integers(0, 6))):
        add(f"s{i}", 1, 1, draw(st.integers(1, 300)), draw(st.sampled_from(LIMITS)))
    return policy, nodes, jobs, runtimes


@settings(max_examples=examples(150), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(draining_cases())
def test_no_gang_waiting_on_draining_nodes_starts_later_than_its_reserved_start(case):
    check_reservations_kept(case)
