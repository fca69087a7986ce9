"""The controller's state machine without daemons: plans carried out as node commands, node reports as job states."""

from __future__ import annotations

import pytest

from gpud.controller.cluster import Cluster
from gpud.controller.job_events import with_submitted_event
from gpud.controller.nodes import Gpu, NodeRecord
from gpud.controller.persist import Persister
from gpud.jobs import Job
from gpud.plugins import make_plugin_manager
from gpud.policy_file import parse_policy
from gpud.store import Event
from gpud.submission import Submission

POLICY = {"min_runtime": 0, "grace_period": 5,
          "projects": [{"name": "a", "gpu_quota": 1}, {"name": "b", "gpu_quota": 1}]}


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def cluster():
    clock = Clock()
    state = Cluster(parse_policy(POLICY, "test"), make_plugin_manager(), Persister(None, None), clock)
    state.node_messages.register(NodeRecord("n1", cpus=8, memory_gib=64,
                                            gpus=[Gpu(0, "GPU-0"), Gpu(1, "GPU-1")]), tasks=[])
    state.outbox.take()
    return state


def submit(cluster: Cluster, project: str, gpus: float = 1) -> str:
    job = Job(id="", user="u", project=project, workdir="/tmp", command=["true"], gpus=gpus)
    return cluster.job_service.submit([Submission(job)], {})[0]


def cycle(cluster: Cluster) -> dict[str, list[dict]]:
    scheduler = cluster.core.prepare((n.spec() for n in cluster.nodes.values()),
                                     lambda: (cluster.jobs[i].spec() for i in sorted(cluster.core.in_core)),
                                     cluster.clock())
    plan, skip = cluster.core.finished(scheduler.cycle(cluster.clock()))
    cluster.plans.apply(plan, skip)
    return cluster.outbox.take()


def report(cluster: Cluster, order: dict, state: str, **fields) -> None:
    cluster.node_messages.task_report("n1", {"job": order["job"], "task": order["task"], "attempt": order["attempt"],
                                             "state": state, **fields})


def test_a_start_waits_until_the_evicted_task_has_released_its_gpus(cluster):
    hogs = [submit(cluster, "a"), submit(cluster, "a")]
    starts = cycle(cluster)["n1"]
    assert sorted(o["job"] for o in starts) == hogs
    for order in starts:
        report(cluster, order, "running", pid=100)
    cluster.outbox.take()
    newcomer = submit(cluster, "b")
    orders = cycle(cluster)["n1"]
    stops = [o for o in orders if o["type"] == "stop"]
    assert [o["reason"] for o in stops] == ["preempted"]
    assert not [o for o in orders if o["type"] == "start"], "the GPU is still held by the stopping task"
    victim = stops[0]
    report(cluster, victim, "exited", exit_code=None, term_signal=15)
    orders = cluster.outbox.take()["n1"]
    assert [(o["type"], o["job"]) for o in orders] == [("ack", victim["job"]), ("start", newcomer)]
    assert cluster.jobs[victim["job"]].state == "PENDING"
    assert cluster.jobs[victim["job"]].restart_count == 1


def test_a_task_whose_supervisor_never_started_is_requeued_not_failed(cluster):
    job_id = submit(cluster, "a")
    (start,) = cycle(cluster)["n1"]
    report(cluster, start, "exited", reason="failed to start: the supervisor did not start",
           cause="no_supervisor")
    job = cluster.jobs[job_id]
    assert job.state == "PENDING" and job.restart_count == 1


@pytest.mark.parametrize("cause, words, state, reason", [
    ("timeout", "over time", "TIMEOUT", "task 0 reached the time limit"),
    ("exited", "timeout", "FAILED", "task 0 was killed by signal 15"),
    ("exited", "supervisor lost", "FAILED", "task 0 was killed by signal 15"),
    ("fenced", "anything", "PENDING", "requeued: node n1: task 0 anything"),
    ("out_of_memory", "out of memory (limit 1G)", "FAILED", "task 0 out of memory (limit 1G)"),
    ("stopped", "gpu memory: over", "FAILED", "task 0 was killed by signal 15"),
])
def test_the_exit_cause_decides_the_jobs_fate_and_the_words_are_only_shown(cluster, cause, words, state, reason):
    job_id = submit(cluster, "a")
    job = cluster.jobs[job_id]
    (start,) = cycle(cluster)["n1"]
    report(cluster, start, "running", pid=7)
    report(cluster, start, "exited", term_signal=15, reason=words, cause=cause)
    assert (job.state, job.reason) == (state, reason)


def test_a_task_that_cannot_start_fails_its_job_with_the_reason(cluster):
    job_id = submit(cluster, "a")
    job = cluster.jobs[job_id]
    (start,) = cycle(cluster)["n1"]
    report(cluster, start, "exited", reason="failed to start: no user 'u' on this node", cause="failed_to_start")
    assert job_id not in cluster.jobs
    assert (job.state, job.reason) == ("FAILED", "task 0 failed to start: no user 'u' on this node")
    assert cluster.outbox.take()["n1"][0]["type"] == "ack"


def test_a_task_the_node_runs_but_nobody_wants_is_stopped(cluster):
    cluster.node_messages.reconcile("n1", [{"job": "77", "task": 0, "attempt": 0, "state": "running", "pid": 5}], fresh=True)
    (stop,) = cluster.outbox.take()["n1"]
    assert (stop["type"], stop["job"], stop["reason"]) == ("stop", "77", "not wanted")


def test_a_running_task_missing_from_a_reregistering_node_is_requeued(cluster):
    job_id = submit(cluster, "a")
    (start,) = cycle(cluster)["n1"]
    report(cluster, start, "running", pid=100)
    cluster.node_messages.reconcile("n1", [], fresh=True)
    job = cluster.jobs[job_id]
    assert job.state == "PENDING" and job.restart_count == 1


@pytest.mark.parametrize("requeue", [True, False])
def test_a_heartbeat_missing_one_task_of_a_gang_on_the_node_loses_the_gang_once(cluster, requeue):
    job = Job(id="", user="u", project="a", workdir="/tmp", command=["true"], gpus=1, tasks=2, requeue=requeue)
    (job_id,) = cluster.job_service.submit([Submission(job)], {})
    starts = cycle(cluster)["n1"]
    assert len(starts) == 2
    report(cluster, starts[0], "running", pid=100)
    cluster.clock.now += 10
    cluster.node_messages.heartbeat("n1", None, [])  # the running task is gone, its partner not yet seen
    if requeue:
        assert (job.state, job.restart_count) == ("PENDING", 1)
        assert not cluster.runs.wanted["n1"] and not cluster.runs.unsent["n1"]
    else:
        assert job_id not in cluster.jobs and job.state == "NODE_FAIL"
    stops = [o for o in cluster.outbox.take()["n1"] if o["type"] == "stop"]
    assert sorted(o["task"] for o in stops) == [0, 1]


def test_an_array_element_lost_to_a_silent_node_keeps_its_place_in_the_array_limit(cluster):
    cluster.node_messages.register(NodeRecord("n2", cpus=8, memory_gib=64, gpus=[Gpu(0, "GPU-20")]), tasks=[])
    cluster.outbox.take()
    job = Job(id="", user="u", project="a", workdir="/tmp", command=["true"], gpus=1)
    ids = cluster.job_service.submit([Submission(job, array_indices=[0, 1], array_limit=1)], {})
    starts = cycle(cluster)
    ((node, (start,)),) = [(name, orders) for name, orders in starts.items() if orders]
    cluster.node_messages.task_report(node, {"job": start["job"], "task": 0, "attempt": start["attempt"],
                                             "state": "running", "pid": 100})
    other = next(name for name in cluster.nodes if name != node)
    cluster.clock.now += 120
    cluster.node_messages.heartbeat(other, None, [])
    cluster.node_messages.check_nodes(timeout_s=60)  # the element's node fell silent: it is requeued
    assert cluster.nodes[node].state == "down" and cluster.jobs[start["job"]].state == "PENDING"
    cluster.clock.now += 60  # past the silent node's lease and grace period
    cluster.node_messages.heartbeat(other, None, [])
    cluster.node_messages.check_nodes(timeout_s=60)
    assert cluster.job_service.array_queued[ids[0].partition("_")[0]] == 1
    (restart,) = cycle(cluster)[other]
    assert (restart["type"], restart["job"]) == ("start", start["job"])


def test_a_silent_node_fails_its_non_preemptible_job(cluster):
    job = Job(id="", user="u", project="a", workdir="/tmp", command=["true"], gpus=1, priority=125,
              priority_class="inference")
    (job_id,) = cluster.job_service.submit([Submission(job)], {})
    cycle(cluster)
    cluster.clock.now += 120
    cluster.node_messages.check_nodes(timeout_s=60)
    assert job_id not in cluster.jobs
    assert (job.state, job.reason) == ("NODE_FAIL", "node n1 is down (no heartbeat for 120 s)")
    assert cluster.nodes["n1"].state == "down"


def test_the_submitted_event_comes_from_the_record_unless_an_older_store_kept_it(cluster):
    stored_before = list(cluster.persist._events)
    job = cluster.jobs[submit(cluster, "a")]
    assert cluster.persist._events == stored_before, "a submit stores no event row"
    started = Event(job.submitted + 1, "started", "on n1", job.id, "n1")
    made = with_submitted_event(job, [started])
    assert [(e.kind, e.time, e.message) for e in made] == [
        ("submitted", job.submitted, "submitted by u to project a"), ("started", job.submitted + 1, "on n1")]
    stored = Event(job.submitted, "submitted", "submitted by u to project a", job.id)
    assert with_submitted_event(job, [stored, started]) == [stored, started]


def test_the_largest_node_follows_registrations_and_gpu_health(cluster):
    assert (cluster.node_messages.largest_node().max_gpus, cluster.node_messages.largest_node().max_cpus) == (2, 8)
    cluster.node_messages.register(NodeRecord("n2", cpus=32, memory_gib=256, gpus=[Gpu(i, f"GPU-2{i}") for i in range(4)]),
                                   tasks=[])
    assert (cluster.node_messages.largest_node().max_gpus, cluster.node_messages.largest_node().max_cpus) == (4, 32)
    cluster.node_messages.heartbeat("n2", [Gpu(i, f"GPU-2{i}") for i in range(3)], tasks=[])  # a GPU no longer reported
    assert cluster.node_messages.largest_node().max_gpus == 3


def test_a_staged_job_is_nowhere_until_accepted_and_hears_of_its_dependency_ending(cluster):
    from gpud.jobs import Dependency
    target = submit(cluster, "a")
    job = Job(id="", user="u", project="b", workdir="/tmp", command=["true"], gpus=1,
              depends=[Dependency("afterok", target)])
    (staged,) = cluster.job_service.stage([Submission(job)], {})
    assert staged.id not in cluster.jobs and staged.id not in cluster.core.in_core
    cluster.job_service.cancel(cluster.jobs[target], "u")           # ends while the staged job's record is written
    cluster.job_service.accept([staged])
    assert cluster.jobs[staged.id].depends[0].met is False
    assert "can never be met" in cluster.waits.reason_of(staged)


def test_a_dropped_job_leaves_nothing_behind(cluster):
    from gpud.jobs import Dependency
    target = submit(cluster, "a")
    job = Job(id="", user="u", project="b", workdir="/tmp", command=["true"], gpus=1,
              depends=[Dependency("afterany", target)])
    staged = cluster.job_service.stage([Submission(job, array_indices=[0, 1])], {})
    cluster.job_service.drop(staged)
    assert not cluster.job_service.staged and target not in cluster.job_service.dependents and not cluster.job_service.arrays.get(staged[0].array_id)
    cycle(cluster)
    assert all(j.id not in cluster.jobs for j in staged)


from hypothesis import given, settings, HealthCheck  # noqa: E402
from hypothesis import strategies as st  # noqa: E402
from hypothesis_budget import examples

OPS = st.lists(st.tuples(st.sampled_from(["cancel", "hold", "release"]),
                         st.lists(st.integers(0, 29), max_size=12)), max_size=12)


@settings(max_examples=examples(60), deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(limit=st.integers(1, 6), ops=OPS)
def test_an_array_keeps_exactly_its_limit_queued_through_changes_of_many(limit, ops):
    clock = Clock()
    cluster = Cluster(parse_policy(POLICY, "test"), make_plugin_manager(), Persister(None, None), clock)
    job = Job(id="", user="u", project="a", workdir="/tmp", command=["true"], gpus=1)
    ids = cluster.job_service.submit([Submission(job, array_indices=tuple(range(30)), array_limit=limit)], {})
    array_id = ids[0].partition("_")[0]
    for verb, picks in ops:
        chosen = [cluster.jobs[ids[i]] for i in sorted(set(picks)) if ids[i] in cluster.jobs]
        cluster.job_service.change_many(chosen, verb, "u")
        members = [cluster.jobs[i] for i in ids if i in cluster.jobs]
        queued = [j for j in members if j.id in cluster.core.in_core]
        assert len(queued) == cluster.job_service.array_queued.get(array_id, 0) <= limit
        waiting = [j for j in members if not j.hold and j.id not in cluster.core.in_core]
        assert not waiting or len(queued) == limit, "an element waits while the array is under its limit"


def test_a_dependency_that_ends_while_a_submit_is_staged_in_parts_counts_as_it_ended(cluster):
    from gpud.jobs import Dependency
    target = submit(cluster, "a")
    (start,) = cycle(cluster)["n1"]
    report(cluster, start, "running", pid=10)
    job = Job(id="", user="u", project="b", workdir="/tmp", command=["true"], gpus=1,
              depends=[Dependency("afterok", target)])
    parts = cluster.job_service.stage_in_parts([Submission(job, array_indices=tuple(range(5)))], {}, part=2)
    staged = list(next(parts))
    report(cluster, start, "exited", exit_code=0)  # the target completes between two parts
    assert target not in cluster.jobs
    for part in parts:
        staged.extend(part)
    cluster.job_service.accept(staged)
    assert [cluster.jobs[j.id].depends[0].met for j in staged] == [True] * 5


def test_a_batch_of_single_jobs_is_staged_in_parts_numbered_in_order(cluster):
    jobs = [Job(id="", user="u", project="b", workdir="/tmp", command=["true"], gpus=1) for _ in range(5)]
    array = Job(id="", user="u", project="b", workdir="/tmp", command=["true"], gpus=1)
    submissions = [Submission(job) for job in jobs[:3]] + [Submission(array, array_indices=(0, 1))]
    submissions += [Submission(job) for job in jobs[3:]]
    parts = list(cluster.job_service.stage_in_parts(submissions, {}, part=2))
    assert [len(part) for part in parts] == [2, 2, 2, 1]  # a part never waits for a submission's end
    ids = [job.id for part in parts for job in part]
    first = int(ids[0])
    assert ids == [str(first), str(first + 1), str(first + 2), f"{first + 3}_0", f"{first + 3}_1",
                   str(first + 4), str(first + 5)]
    assert not any(job_id in cluster.jobs for job_id in ids)  # staged only: nowhere until accepted
    cluster.job_service.accept([job for part in parts for job in part])
    assert all(cluster.jobs[job_id].state == "PENDING" for job_id in ids)


def test_a_silent_nodes_requeued_job_runs_nowhere_before_the_nodes_lease_and_grace_are_over(cluster):
    cluster.node_messages.register(NodeRecord("n2", cpus=8, memory_gib=64, gpus=[Gpu(0, "GPU-0")]), tasks=[])
    job_id = submit(cluster, "a")
    cycle(cluster)
    job = cluster.jobs[job_id]
    first = job.runs[0].placement.node
    silent = cluster.nodes[first]
    other = "n2" if first == "n1" else "n1"
    last_heard = cluster.clock.now
    cluster.clock.now += 61
    cluster.node_messages.heartbeat(other, None, [])
    cluster.node_messages.check_nodes(timeout_s=60)
    assert silent.state == "down" and (job.state, job.restart_count) == ("PENDING", 1)
    assert cycle(cluster) == {}
    assert cluster.waits.reason_of(job).startswith(f"waiting 6 s more for node {first}'s lease and grace period")
    # The lease (60 s), the grace period (5 s) and the margin for the node to kill what ignored its signal.
    cluster.clock.now = last_heard + 60 + 5 + 2 - 0.1
    cluster.node_messages.heartbeat(other, None, [])
    cluster.node_messages.check_nodes(timeout_s=60)
    assert cycle(cluster) == {}
    cluster.clock.now = last_heard + 60 + 5 + 2
    cluster.node_messages.heartbeat(other, None, [])
    cluster.node_messages.check_nodes(timeout_s=60)
    (start,) = cycle(cluster)[other]
    assert (start["job"], start["attempt"]) == (job_id, 1)


def test_a_down_node_that_heartbeats_again_is_up_with_its_down_reason_cleared(cluster):
    node = cluster.nodes["n1"]
    cluster.clock.now += 120
    cluster.node_messages.check_nodes(timeout_s=60)
    assert (node.state, node.reason) == ("down", "no heartbeat for 120 s")
    cluster.node_messages.heartbeat("n1", None, [])
    assert (node.state, node.reason) == ("up", "")
    assert node.spec().schedulable
    job_id = submit(cluster, "a")
    assert [o["job"] for o in cycle(cluster)["n1"]] == [job_id]


def test_a_drained_node_back_from_silence_keeps_its_drain_reason(cluster):
    node = cluster.nodes["n1"]
    cluster.node_messages.drain(node, "bad fan", "admin")
    cluster.clock.now += 120
    cluster.node_messages.check_nodes(timeout_s=60)
    assert node.reason == "no heartbeat for 120 s"
    cluster.node_messages.heartbeat("n1", None, [])
    assert (node.state, node.drain, node.reason) == ("up", True, "bad fan")
    cluster.clock.now += 120
    cluster.node_messages.check_nodes(timeout_s=60)
    cluster.node_messages.register(NodeRecord("n1", cpus=8, memory_gib=64, gpus=[Gpu(0, "GPU-0"), Gpu(1, "GPU-1")]), tasks=[])
    back = cluster.nodes["n1"]
    assert (back.state, back.reason, back.drain) == ("up", "bad fan", True)
    cluster.node_messages.resume(back, "admin")
    assert back.reason == ""


NODE_CHANGES = st.lists(st.tuples(
    st.sampled_from(["register", "heartbeat"]), st.sampled_from(["n1", "n2", "n3"]), st.integers(0, 4),
    st.sampled_from([8, 32, 64]), st.sampled_from([40.0, 80.0]), st.sampled_from([{}, {"zone": "a"}, {"ib": "yes"}])),
    max_size=12)


@settings(max_examples=examples(60), deadline=None)
@given(changes=NODE_CHANGES)
def test_the_largest_node_is_what_the_nodes_hold_now_after_any_changes(changes):
    clock = Clock()
    cluster = Cluster(parse_policy(POLICY, "test"), make_plugin_manager(), Persister(None, None), clock)
    messages = cluster.node_messages
    for verb, name, gpus, cpus, gpu_memory, labels in changes:
        inventory = [Gpu(i, f"GPU-{name}-{i}", memory_gib=gpu_memory) for i in range(gpus)]
        if verb == "register" or name not in cluster.nodes:
            messages.register(NodeRecord(name, cpus=cpus, memory_gib=cpus * 8, gpus=inventory, labels=labels), tasks=[])
        else:
            messages.heartbeat(name, inventory, tasks=[])  # GPUs reported anew: some gone, or larger
        messages.largest_node()  # asked between changes, so a stale answer would be kept
    nodes = list(cluster.nodes.values())
    largest = messages.largest_node()
    if not nodes:
        assert largest.max_gpus is None and largest.sized is None
        return
    by_labels: dict = {}
    for node in nodes:
        labels = tuple(sorted(node.labels.items()))
        size = (len(node.gpus), max((g.memory_gib for g in node.gpus), default=0.0), node.cpus, node.memory_gib)
        by_labels[labels] = tuple(map(max, zip(by_labels.get(labels, size), size)))
    assert largest.max_gpus == max(len(n.gpus) for n in nodes)
    assert largest.max_gpu_memory_gib == max((g.memory_gib for n in nodes for g in n.gpus), default=0.0)
    assert (largest.max_cpus, largest.max_memory_gib) == (max(n.cpus for n in nodes), max(n.memory_gib for n in nodes))
    assert largest.labels == tuple(sorted(by_labels))
    assert largest.sized == tuple((labels, *size) for labels, size in sorted(by_labels.items()))
