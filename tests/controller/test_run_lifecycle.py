"""A task run moves only along gpud.lifecycle.RUN_TRANSITIONS, whatever its node reports and in whatever order;
and an array's count of elements in the scheduler stays the number it holds there, so its limit never stalls it."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from gpud.controller.cluster import Cluster
from gpud.controller.nodes import Gpu, NodeRecord
from gpud.controller.persist import Persister
from gpud.jobs import Job, TaskRun
from gpud.lifecycle import (RUN_EXITED, RUN_NONE, RUN_RUNNING, RUN_STARTING, RUN_STATES, RUN_TRANSITIONS,
                            TransitionError, check_run_transition)
from gpud.plugins import make_plugin_manager
from gpud.policy_file import parse_policy
from gpud.submission import Submission
from hypothesis_budget import examples

POLICY = {"min_runtime": 0, "grace_period": 5,
          "projects": [{"name": "a", "gpu_quota": 2}, {"name": "b", "gpu_quota": 2}]}


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_each_edge_of_the_table_is_allowed_and_named():
    for (current, new), name in RUN_TRANSITIONS.items():
        run = TaskRun(state=current)
        assert run.move_to(new) == name and run.state == new


@pytest.mark.parametrize("current", RUN_STATES)
@pytest.mark.parametrize("new", RUN_STATES)
def test_a_move_outside_the_table_is_refused_naming_both_states(current, new):
    if (current, new) in RUN_TRANSITIONS:
        return
    run = TaskRun(state=current)
    with pytest.raises(TransitionError, match=f"from {current} to {new}"):
        run.move_to(new)
    assert run.state == current
    with pytest.raises(TransitionError):
        check_run_transition(current, new)


def test_an_exited_run_is_final_and_a_fresh_run_starts_from_none():
    assert not [edge for edge in RUN_TRANSITIONS if edge[0] == RUN_EXITED]
    assert TaskRun().state == RUN_NONE


PARSED = parse_policy(POLICY, "test")
PLUGINS = make_plugin_manager()  # answers questions only: one serves every example


def make_cluster() -> Cluster:
    cluster = Cluster(PARSED, PLUGINS, Persister(None, None), Clock())
    for name in ("n1", "n2"):
        cluster.node_messages.register(NodeRecord(name, cpus=8, memory_gib=64,
                                                  gpus=[Gpu(0, f"{name}-0"), Gpu(1, f"{name}-1")]), tasks=[])
    cluster.outbox.take()
    return cluster


def cycle(cluster: Cluster) -> None:
    scheduler = cluster.core.prepare((n.spec() for n in cluster.nodes.values() if n.state != "down"),
                                     lambda: (cluster.jobs[i].spec() for i in sorted(cluster.core.in_core)),
                                     cluster.clock())
    plan, skip = cluster.core.finished(scheduler.cycle(cluster.clock()))
    cluster.plans.apply(plan, skip)


def orders(cluster: Cluster) -> list[tuple[str, dict]]:
    return [(node, order) for node, messages in cluster.outbox.take().items() for order in messages
            if order["type"] in ("start", "stop")]


# One step of a random history: what the cluster is told, with which of the orders sent so far, and how.
steps = st.one_of(
    st.tuples(st.just("submit"), st.sampled_from(["a", "b"]), st.sampled_from([1.0, 0.5, 2.0]),
              st.integers(1, 2), st.booleans(), st.sampled_from([None, 2, 3])),
    st.tuples(st.just("cycle")),
    st.tuples(st.just("running"), st.integers(0, 30), st.integers(1, 3)),
    st.tuples(st.just("exited"), st.integers(0, 30), st.sampled_from([0, 1, None])),
    st.tuples(st.just("heartbeat"), st.sampled_from(["n1", "n2"]), st.integers(0, 3)),
    st.tuples(st.just("cancel"), st.integers(0, 30)),
    st.tuples(st.just("silence"), st.sampled_from([10.0, 200.0])),
)


def snapshot(cluster: Cluster) -> dict[tuple[str, int], tuple[int, str]]:
    return {(job.id, task): (id(run), run.state) for job in cluster.jobs.values() for task, run in enumerate(job.runs)}


def apply_step(cluster: Cluster, step: tuple, sent: list[tuple[str, dict]]) -> None:
    kind = step[0]
    if kind == "submit":
        _, project, gpus, tasks, requeue, elements = step
        job = Job(id="", user="u", project=project, workdir="/tmp", command=["true"], gpus=gpus, tasks=tasks,
                  requeue=requeue)
        array = (tuple(range(elements)), 1) if elements else (None, None)
        cluster.job_service.submit([Submission(job, array_indices=array[0], array_limit=array[1])], {})
    elif kind == "cycle":
        cycle(cluster)
    elif kind in ("running", "exited") and sent:
        node, order = sent[step[1] % len(sent)]
        report = {"job": order["job"], "task": order["task"], "attempt": order["attempt"], "state": kind,
                  "job_uid": order.get("job_uid", "")}
        if kind == "running":
            report["pid"] = 100 + step[2]
        else:
            report["exit_code"] = step[2]
        if node in cluster.nodes:
            cluster.node_messages.task_report(node, report)
    elif kind == "heartbeat":
        reports = [{"job": o["job"], "task": o["task"], "attempt": o["attempt"], "state": "running", "pid": 7,
                    "job_uid": o.get("job_uid", "")} for node, o in sent if node == step[1] and o["type"] == "start"]
        cluster.node_messages.heartbeat(step[1], None, reports[len(reports) - step[2]:])  # the last few, or none
    elif kind == "cancel" and cluster.jobs:
        jobs = sorted(cluster.jobs)
        cluster.job_service.cancel(cluster.jobs[jobs[step[1] % len(jobs)]], "u")
    elif kind == "silence":
        cluster.clock.now += step[1]
        cluster.node_messages.heartbeat("n1", None, [])  # n1 keeps talking; n2 may fall silent
        cluster.node_messages.check_nodes(timeout_s=60.0)


def check_array_counts(cluster: Cluster) -> None:
    """Each array's count of elements in the scheduler is the number it has there, within its limit."""
    service = cluster.job_service
    for array_id, members in service.arrays.items():
        queued = sum(1 for member in members if member in cluster.core.in_core)
        assert service.array_queued[array_id] == queued, (array_id, dict(service.array_queued), queued)
        limit = cluster.jobs[next(iter(members))].array_limit
        assert limit is None or queued <= limit


@settings(max_examples=examples(60), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(steps, min_size=1, max_size=40))
# A running array element that its node no longer runs is requeued: it once kept its count in the array's limit.
@example([("submit", "a", 1.0, 1, True, 2), ("cycle",), ("running", 0, 1), ("heartbeat", "n1", 0)])
def test_runs_move_along_the_table_and_arrays_keep_count_whatever_the_nodes_report(history):
    cluster = make_cluster()
    sent: list[tuple[str, dict]] = []
    for step in history:
        before = snapshot(cluster)
        apply_step(cluster, step, sent)  # a move outside the table raises TransitionError here
        sent.extend(orders(cluster))
        for key, (ident, state) in snapshot(cluster).items():
            old = before.get(key)
            if old is None or old[0] != ident:
                # A run made since the last step: fresh (none), or placed at once (starting).
                assert state in (RUN_NONE, RUN_STARTING), (key, state)
            elif old[1] != state:
                assert (old[1], state) in RUN_TRANSITIONS, (key, old[1], state)
        check_array_counts(cluster)
    for job in cluster.jobs.values():
        for run in job.runs:
            assert (run.placement is None) == (run.state == RUN_NONE), (job.id, run)
            assert run.state in (RUN_NONE, RUN_STARTING, RUN_RUNNING, RUN_EXITED)
