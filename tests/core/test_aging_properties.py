"""Aging over random clusters of every job shape, in simulated time (hypothesis).

With the policy's ``age_weight``, a job never starts while a job of its
project of the same shape (request, tasks, gang minimum, time limit) that
stands higher in the aged order, ``priority + age_weight x hours waited``
at that moment, still waits: the older job would have fit where it did.
Running jobs are kept from preemption (a long minimum run time): preemption
goes by priority, and the point here is the order of the waiting jobs.
"""

from __future__ import annotations

from hypothesis import HealthCheck, given, note, settings
from hypothesis import strategies as st
from hypothesis_budget import examples

from gpud.model import JobSpec, NodeSpec, Resources
from gpud.policy import Department, Policy, Project, Reservations
from test_reservation_properties import EPOCH, LIMITS, POOL, replay, requests


@st.composite
def aged_cases(draw):
    """A policy of one project with an ``age_weight``, 1-3 nodes and up to 14 jobs of every shape and of
    three priorities (all preemptible: above, quota decides), several of one shape, submitted over the first 300 seconds."""
    weight = draw(st.sampled_from([0.0, 100.0, 1000.0, 10000.0]))
    department = draw(st.sampled_from(["default", "research"]))
    departments = {department: Department(department, implicit=department == "default",
                                          quota={POOL: Resources(64.0, 0.0, 0.0)} if department != "default" else {})}
    policy = Policy(departments=departments, projects={"p": Project("p", department=department)},
                    min_runtime_s=1e9, age_weight=weight,
                    reservations=Reservations(jobs=draw(st.integers(0, 3))),
                    placement=draw(st.sampled_from(["binpack", "spread"])))
    nodes = tuple(NodeSpec(f"n{i}", gpus=draw(st.integers(1, 8)), gpu_memory_gib=80.0,
                           cpus=float(draw(st.integers(4, 32))), memory_gib=float(draw(st.integers(16, 128))))
                  for i in range(draw(st.integers(1, 3))))
    shapes = []
    for _ in range(draw(st.integers(1, 3))):
        tasks = draw(st.integers(1, 3))
        shapes.append((draw(requests()), tasks, draw(st.one_of(st.none(), st.integers(1, tasks))),
                       draw(st.sampled_from(LIMITS))))
    jobs, runtimes = [], {}
    for seq in range(draw(st.integers(2, 14))):
        request, tasks, min_tasks, limit = draw(st.sampled_from(shapes))
        job = JobSpec(f"j{seq}", "p", request, priority=draw(st.sampled_from([25, 50, 75])), tasks=tasks,
                      min_tasks=min_tasks, submitted=EPOCH + draw(st.integers(0, 300)), seq=seq, time_limit=limit,
                      placements=(None,) * tasks)
        jobs.append(job)
        runtimes[job.id] = float(draw(st.integers(1, int(limit))))
    return policy, nodes, jobs, runtimes


def same_shape(one: JobSpec, other: JobSpec) -> bool:
    return (one.request, one.tasks, one.min_tasks, one.time_limit) == (other.request, other.tasks, other.min_tasks,
                                                                       other.time_limit)


def aged(job: JobSpec, weight: float, at: float) -> float:
    """The job's standing at ``at``: its priority plus ``weight`` points an hour it has waited."""
    return job.priority + weight * (at - job.submitted) / 3600.0


@settings(max_examples=examples(150), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(aged_cases())
def test_no_job_starts_while_one_of_its_shape_aged_above_it_waits(case):
    policy, nodes, jobs, runtimes = case
    weight = policy.age_weight
    note(f"age_weight={weight} reservations.jobs={policy.reservations.jobs} placement={policy.placement}")
    for node in nodes:
        note(f"{node.name}: {node.gpus} GPUs, {node.cpus:g} CPUs, {node.memory_gib:g} GiB")
    for job in jobs:
        note(f"{job.id}: {job.request} x{job.tasks} (min {job.min_tasks}) priority {job.priority} submitted "
             f"{job.submitted - EPOCH:g} limit {job.time_limit:g} runs {runtimes[job.id]:g}")
    _, started, _ = replay(policy, nodes, jobs, runtimes)
    for b in jobs:
        at = started.get(b.id)
        if at is None:
            continue
        for a in jobs:
            if a is b or not same_shape(a, b) or a.submitted > at or started.get(a.id, float("inf")) <= at:
                continue
            assert aged(a, weight, at) <= aged(b, weight, at) + 1e-6, (
                f"{b.id} started at {at - EPOCH:g} s standing at {aged(b, weight, at):g} while {a.id} waited "
                f"standing at {aged(a, weight, at):g}")
