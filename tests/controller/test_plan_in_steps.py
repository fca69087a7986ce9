"""A plan carried out a job at a time, the cluster changing between steps (as the controller's loop lets it).

A job cancelled or held between steps is not started; once a node goes down the
binds not yet carried out are dropped, and the next cycle places those
jobs on what is left. Whatever happens between steps, every job ends up
either started once or waiting, never started on a down node; the same holds
for a job changed while the snapshot of a cycle that builds the scheduler
anew is read a piece at a time. A property test draws clusters, jobs of
every whole and fractional size and gangs, and cancels, holds and nodes
going down between any two steps.
"""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from gpud.controller.cluster import Cluster
from gpud.controller.nodes import Gpu, NodeRecord
from gpud.controller.persist import Persister
from gpud.jobs import Job
from gpud.plugins import make_plugin_manager
from gpud.policy_file import parse_policy
from gpud.submission import Submission
from hypothesis_budget import examples

POLICY = {"min_runtime": 0, "grace_period": 5, "projects": [{"name": "a", "gpu_quota": 8}]}


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def make_cluster(nodes: int = 2, gpus: int = 2) -> Cluster:
    cluster = Cluster(parse_policy(POLICY, "test"), make_plugin_manager(), Persister(None, None), Clock())
    for number in range(nodes):
        cluster.node_messages.register(NodeRecord(f"n{number}", cpus=8, memory_gib=64,
                                                  gpus=[Gpu(i, f"GPU-{number}-{i}") for i in range(gpus)]), tasks=[])
    cluster.outbox.take()
    return cluster


def submit(cluster: Cluster, count: int) -> list[str]:
    jobs = [Submission(Job(id="", user="u", project="a", workdir="/tmp", command=["true"], gpus=1))
            for _ in range(count)]
    return cluster.job_service.submit(jobs, {})


def planned(cluster: Cluster):
    """Run a cycle; the plan and the live set of jobs changed since (as the controller gets them)."""
    scheduler = cluster.core.prepare((n.spec() for n in cluster.nodes.values()),
                                     lambda: (cluster.jobs[i].spec() for i in sorted(cluster.core.in_core)),
                                     cluster.clock())
    plan, skip = cluster.core.finished(scheduler.cycle(cluster.clock()))
    assert plan is not None
    return plan, skip


def started(cluster: Cluster) -> dict[str, list[str]]:
    """The jobs each node was told to start since the last call."""
    return {node: sorted(m["job"] for m in messages if m["type"] == "start")
            for node, messages in cluster.outbox.take().items()}


def test_jobs_cancelled_or_held_between_steps_are_not_started_and_the_others_are():
    cluster = make_cluster()
    ids = submit(cluster, 4)
    plan, skip = planned(cluster)
    steps = cluster.plans.apply_in_steps(plan, skip)
    next(steps)  # the evictions (none)
    next(steps)  # the first job bound and its start made
    first = started(cluster)
    (done,) = [job for starts in first.values() for job in starts]
    cancelled, held = [job for job in ids if job != done][:2]
    cluster.job_service.cancel(cluster.jobs[cancelled], "someone")
    assert cluster.job_service.hold(cluster.jobs[held], "someone")
    for _ in steps:
        pass
    later = [job for starts in started(cluster).values() for job in starts]
    assert sorted([done, *later]) == sorted(job for job in ids if job not in (cancelled, held))
    assert cancelled not in cluster.jobs
    assert cluster.jobs[held].state == "PENDING" and all(run.placement is None for run in cluster.jobs[held].runs)
    assert all(cluster.jobs[job].state == "RUNNING" for job in ids if job not in (cancelled, held))


def test_binds_left_when_a_node_goes_down_are_dropped_and_placed_again_by_the_next_cycle():
    cluster = make_cluster()
    ids = submit(cluster, 4)
    plan, skip = planned(cluster)
    steps = cluster.plans.apply_in_steps(plan, skip)
    next(steps)
    next(steps)
    (node, (first,)) = next(iter(started(cluster).items()))
    other = next(name for name in cluster.nodes if name != node)
    cluster.clock.now += 120
    cluster.nodes[node].last_seen = cluster.clock.now  # only the other node falls silent
    cluster.node_messages.check_nodes(timeout_s=60)
    assert cluster.nodes[other].state == "down"
    for _ in steps:
        pass
    assert not any(started(cluster).values()), "nothing more is started once the scheduler must be rebuilt"
    waiting = sorted(job for job in ids if cluster.jobs[job].state == "PENDING")
    assert len(waiting) == 3
    plan, skip = planned(cluster)
    cluster.plans.apply(plan, skip)
    assert started(cluster) == {node: [job for job in waiting if cluster.jobs[job].state == "RUNNING"]}
    assert len(started_jobs := [job for job in ids if cluster.jobs[job].state == "RUNNING"]) == 2
    assert first in started_jobs
    assert all(run.placement is None or run.placement.node == node
               for job in ids for run in cluster.jobs[job].runs)


def test_a_job_held_while_the_snapshot_is_read_a_piece_at_a_time_is_not_started():
    cluster = make_cluster()
    ids = submit(cluster, 3)
    _, anew = cluster.core.begin()
    assert anew  # the first cycle builds the scheduler
    specs = []
    for job_id in sorted(cluster.core.in_core, key=int):
        specs.append(cluster.jobs[job_id].spec())
        if len(specs) == 1:
            assert cluster.job_service.hold(cluster.jobs[ids[0]], "someone")  # read already, as pending
    nodes = tuple(n.spec() for n in cluster.nodes.values())
    scheduler = cluster.core.build_later(nodes, tuple(specs), cluster.clock())()
    plan, skip = cluster.core.finished(scheduler.cycle(cluster.clock()))
    assert plan is not None and ids[0] in {bind.job for bind in plan.binds}
    cluster.plans.apply(plan, skip)
    assert sorted(job for starts in started(cluster).values() for job in starts) == sorted(ids[1:])
    assert cluster.jobs[ids[0]].state == "PENDING"
    plan, skip = planned(cluster)  # the next cycle knows it is held
    cluster.plans.apply(plan, skip)
    assert not any(started(cluster).values()) and cluster.jobs[ids[0]].state == "PENDING"


@settings(max_examples=examples(60), deadline=None)
@given(nodes=st.integers(1, 3), gpus=st.integers(1, 4),
       shapes=st.lists(st.tuples(st.sampled_from([0.5, 1.0, 2.0]), st.integers(1, 2)), min_size=1, max_size=10),
       actions=st.lists(st.tuples(st.sampled_from(["none", "cancel", "hold", "down"]), st.integers(0, 99)),
                        max_size=12))
def test_whatever_changes_between_steps_no_held_cancelled_or_stale_job_starts_and_no_down_node_is_told(
        nodes, gpus, shapes, actions):
    cluster = make_cluster(nodes, gpus)
    ids = cluster.job_service.submit([Submission(Job(id="", user="u", project="a", workdir="/tmp", command=["true"], gpus=share,
                                                     tasks=tasks)) for share, tasks in shapes], {})
    plan, skip = planned(cluster)
    refused: set[str] = set()
    steps = cluster.plans.apply_in_steps(plan, skip)
    for number, _ in enumerate(steps):
        for node, messages in cluster.outbox.take().items():
            for start in (m for m in messages if m["type"] == "start"):
                assert start["job"] not in refused, "a job held or cancelled between steps was started"
                assert cluster.nodes[node].state == "up", "a start went to a node that is down"
        if number >= len(actions):
            continue
        verb, pick = actions[number]
        if verb == "down":
            node = sorted(cluster.nodes)[pick % len(cluster.nodes)]
            cluster.clock.now += 1
            cluster.node_messages._node_down(cluster.nodes[node], "gone")
        elif verb != "none" and cluster.jobs:
            job = cluster.jobs[sorted(cluster.jobs)[pick % len(cluster.jobs)]]
            if verb == "cancel":
                cluster.job_service.cancel(job, "someone")
                refused.add(job.id)
            elif cluster.job_service.hold(job, "someone"):
                refused.add(job.id)
    cluster.outbox.take()
    for job_id in ids:
        job = cluster.jobs.get(job_id)
        if job is None:
            continue
        placed = [run.placement.node for run in job.runs if run.placement is not None]
        assert all(cluster.nodes[node].state == "up" for node in placed)
        if job.hold:
            assert job.state == "PENDING" and not placed
        assert job.state != "RUNNING" or len(placed) == job.tasks
