"""The user order inside a project over random clusters of every job shape (hypothesis).

Jobs of equal priority in one project go by their users' standing: decayed
usage plus the entry penalty window times the GPUs the user holds, then
those GPUs, then submit time; each start moves its user back, so one
user's flood alternates with the others' jobs within a single cycle.
"""

from __future__ import annotations

import dataclasses

from hypothesis import given, strategies as st

from gpud.core import schedule
from gpud.model import JobSpec, Resources, Snapshot
from gpud.policy import Department, FairShare, Policy, Project

from test_properties import NOW, PM, POOL, SETTINGS, Room, nodes, requests

USERS = ("alice", "bob", "carol")
WINDOW = 600.0


@st.composite
def one_project(draw):
    """One project holding the whole pool; non-preemptible jobs already running (nothing moves them) and
    pending jobs all of one random shape and one priority, of three users with random past usage."""
    specs = draw(nodes())
    capacity = sum(n.gpus for n in specs)
    room = Room(specs)
    request = draw(requests())
    tasks = draw(st.integers(1, 3))
    priority = draw(st.sampled_from([50, 125]))
    jobs = []
    for seq in range(draw(st.integers(0, 4))):
        running_request = draw(requests())
        placement = room.take(draw(st.sampled_from(sorted(room.specs))), running_request)
        if placement is not None:
            jobs.append(JobSpec(id=f"r{seq}", project="p", request=running_request, priority=125,
                                submitted=0.0, started=0.0, placements=(placement,), seq=seq,
                                user=draw(st.sampled_from(USERS))))
    for seq in range(draw(st.integers(1, 14))):
        jobs.append(JobSpec(id=f"j{seq}", project="p", request=request, priority=priority, tasks=tasks,
                            submitted=float(draw(st.integers(0, 50))), seq=100 + seq,
                            placements=(None,) * tasks, user=draw(st.sampled_from(USERS))))
    usage = {("user", POOL, f"p/{user}"): float(draw(st.sampled_from([0, 0, 300, 600, 5000])))
             for user in USERS if draw(st.booleans())}
    policy = Policy(departments={"default": Department("default", implicit=True)},
                    projects={"p": Project("p", quota={POOL: Resources(gpu=capacity, cpu=10 ** 6, memory=10 ** 6)})},
                    placement=draw(st.sampled_from(["binpack", "spread"])),
                    fair_share=FairShare(entry_penalty_s=WINDOW))
    return policy, Snapshot(tuple(specs), tuple(jobs), NOW, usage)


def _gpus(placement) -> float:
    return placement.gpu_share * len(placement.gpu_index)


@SETTINGS
@given(one_project())
def test_pending_jobs_start_in_the_user_order(drawn):
    """The jobs a cycle starts are the first of the user order, taken one at a time: the user with the
    least usage + window x GPUs held (then fewest GPUs, then the earliest job) goes next, and each start
    adds the GPUs it took to its user."""
    policy, snapshot = drawn
    plan = schedule(snapshot, policy, PM)
    took: dict[str, float] = {}
    for bind in plan.binds:
        took[bind.job] = took.get(bind.job, 0.0) + _gpus(bind.placement)
    held = {user: 0.0 for user in USERS}
    for job in snapshot.jobs:
        if job.is_running:
            held[job.user] += sum(_gpus(p) for p in job.placements if p is not None)
    waiting = {user: sorted((j for j in snapshot.jobs if not j.is_running and j.user == user),
                            key=lambda j: (j.submitted, j.seq)) for user in USERS}
    order = []
    while any(waiting.values()):
        user = min((u for u in USERS if waiting[u]),
                   key=lambda u: (snapshot.usage.get(("user", POOL, f"p/{u}"), 0.0) + WINDOW * held[u], held[u],
                                  waiting[u][0].submitted, waiting[u][0].seq))
        job = waiting[user].pop(0)
        order.append(job.id)
        held[user] += took.get(job.id, 0.0)
    started = [job_id in took for job_id in order]
    assert started == sorted(started, reverse=True), (order, sorted(took))

