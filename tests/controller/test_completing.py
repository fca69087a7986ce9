"""Slurm's COMPLETING: a job whose earlier incarnation a node is still stopping starts nowhere until it has ended.

The controller's state machine without daemons (as in test_cluster_state),
and a property over random clusters and job shapes: no start of a job ever
goes out while an earlier copy of it still runs on a node.
"""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings, strategies as st
from hypothesis_budget import examples

from gpud.controller.cluster import Cluster
from gpud.controller.completing import Completing, job_of
from gpud.controller.nodes import Gpu, NodeRecord
from gpud.controller.persist import Persister
from gpud.controller.why import explain
from gpud.jobs import Job
from gpud.plugins import make_plugin_manager
from gpud.policy_file import parse_policy
from gpud.submission import Submission

GRACE_S = 20
POLICY = {"min_runtime": 0, "grace_period": GRACE_S,
          "projects": [{"name": "a", "gpu_quota": 1}, {"name": "b", "gpu_quota": 1}]}


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def make_cluster(nodes: int = 2, gpus: int = 1, policy: dict = POLICY) -> Cluster:
    cluster = Cluster(parse_policy(policy, "test"), make_plugin_manager(), Persister(None, None), Clock())
    for n in range(1, nodes + 1):
        cluster.node_messages.register(NodeRecord(f"n{n}", cpus=8, memory_gib=64,
                                                  gpus=[Gpu(i, f"GPU-{n}-{i}") for i in range(gpus)]), tasks=[])
    cluster.outbox.take()
    return cluster


def submit(cluster: Cluster, project: str, gpus: float = 1, **fields) -> str:
    job = Job(id="", user="u", project=project, workdir="/tmp", command=["true"], gpus=gpus, **fields)
    return cluster.job_service.submit([Submission(job)], {})[0]


def cycle(cluster: Cluster) -> dict[str, list[dict]]:
    scheduler = cluster.core.prepare((n.spec() for n in cluster.nodes.values()),
                                     lambda: (cluster.jobs[i].spec() for i in sorted(cluster.core.in_core)),
                                     cluster.clock())
    plan, skip = cluster.core.finished(scheduler.cycle(cluster.clock()))
    cluster.plans.apply(plan, skip)
    return cluster.outbox.take()


def report(cluster: Cluster, node: str, order: dict, state: str, **fields) -> None:
    cluster.node_messages.task_report(node, {"job": order["job"], "task": order["task"], "attempt": order["attempt"],
                                             "state": state, **fields})


def orders(commands: dict[str, list[dict]], kind: str) -> list[tuple[str, dict]]:
    return [(node, o) for node, sent in commands.items() for o in sent if o["type"] == kind]


def preempted_while_another_node_frees(cluster: Cluster) -> tuple[str, str, dict, str]:
    """Job ``a`` train on one node, a's build job on the other; b reclaims the train job's GPU, then the build
    job ends. Returns (the victim, its old node, the stop order, the node that freed)."""
    build = submit(cluster, "a", priority=100, priority_class="build")
    for node, start in orders(cycle(cluster), "start"):
        report(cluster, node, start, "running", pid=10)
    victim = submit(cluster, "a")
    ((old_node, old_start),) = orders(cycle(cluster), "start")
    report(cluster, old_node, old_start, "running", pid=11)
    cluster.outbox.take()
    submit(cluster, "b")
    commands = cycle(cluster)
    ((stop_node, stop),) = orders(commands, "stop")
    assert (stop_node, stop["job"], stop["reason"]) == (old_node, victim, "preempted")
    assert not orders(commands, "start"), "the reclaimer's GPU is still held by the stopping task"
    (build_node,) = {run.placement.node for run in cluster.jobs[build].runs}
    report(cluster, build_node, {"job": build, "task": 0, "attempt": cluster.jobs[build].runs[0].attempt},
           "exited", exit_code=0)
    cluster.outbox.take()
    return victim, old_node, stop, build_node


def test_a_preempted_job_starts_nowhere_until_its_old_copy_has_ended():
    cluster = make_cluster()
    victim, old_node, stop, free_node = preempted_while_another_node_frees(cluster)
    job = cluster.jobs[victim]
    assert (job.state, job.restart_count) == ("PENDING", 1)
    cluster.clock.now += 5
    assert orders(cycle(cluster), "start") == [], "its old copy is in its grace period on " + old_node
    assert cluster.waits.reason_of(job) == (f"waits for its previous run to end: task 0 on node {old_node} still being "
                                            f"stopped (SIGKILL in 15 s at the latest, after the 20 s grace period)")
    answer = explain(job, cluster)
    assert [b["rule"] for b in answer["blockers"]] == ["completing"]
    assert answer["blockers"][0]["stopping"] == [{"node": old_node, "task": 0, "attempt": stop["attempt"],
                                                  "since": 1000.0}]
    assert [c["condition"] for c in answer["would_start"]] == ["previous_run_ended"]
    report(cluster, old_node, stop, "exited", term_signal=9)
    commands = cycle(cluster)
    assert (free_node, victim) in [(node, o["job"]) for node, o in orders(commands, "start")]
    assert cluster.jobs[victim].runs[0].attempt > stop["attempt"]


def test_a_completing_job_is_scheduled_again_as_soon_as_its_old_copy_is_reported_gone():
    cluster = make_cluster()
    victim, old_node, stop, free_node = preempted_while_another_node_frees(cluster)
    assert victim not in cluster.core.in_core
    # The node re-registers without the task: whatever it was stopping is over.
    cluster.node_messages.reconcile(old_node, [], fresh=True)
    assert victim in cluster.core.in_core
    assert victim not in cluster.completing


def test_a_silent_nodes_stopping_copy_holds_its_job_until_the_lease_and_grace_are_over():
    cluster = make_cluster()
    victim, old_node, stop, free_node = preempted_while_another_node_frees(cluster)
    last_heard = cluster.clock.now
    cluster.clock.now = last_heard + 61
    cluster.node_messages.heartbeat(free_node, None, [])
    cluster.node_messages.check_nodes(timeout_s=60)
    assert cluster.nodes[old_node].state == "down"
    assert orders(cycle(cluster), "start") == []
    assert "lease and grace period" in cluster.waits.reason_of(cluster.jobs[victim])
    assert [b["rule"] for b in explain(cluster.jobs[victim], cluster)["blockers"]] == ["fenced"]
    cluster.clock.now = last_heard + 60 + GRACE_S + 2
    cluster.node_messages.heartbeat(free_node, None, [])
    cluster.node_messages.check_nodes(timeout_s=60)
    assert [(node, o["job"]) for node, o in orders(cycle(cluster), "start")] == [(free_node, victim)]


def test_a_job_cancelled_while_completing_leaves_nothing_waiting():
    cluster = make_cluster()
    victim, old_node, stop, free_node = preempted_while_another_node_frees(cluster)
    cluster.job_service.cancel(cluster.jobs[victim], "u")
    assert victim not in cluster.completing
    report(cluster, old_node, stop, "exited", term_signal=9)  # reported late: nothing to release
    assert victim not in cluster.jobs


def test_completing_survives_a_controller_restart():
    cluster = make_cluster()
    victim, old_node, stop, free_node = preempted_while_another_node_frees(cluster)
    restarted = make_cluster(nodes=0)
    restarted.restore([cluster.jobs[victim]], [cluster.nodes[old_node], cluster.nodes[free_node]],
                      cluster.job_service.next_seq)
    assert victim in restarted.completing and victim not in restarted.core.in_core


def test_incarnation_keys_name_their_job_even_with_slashes_in_the_id():
    assert job_of("42_3/1/7") == ("42_3", 1, 7)
    assert job_of("a/b/0/1") == ("a/b", 0, 1)
    assert job_of("nonsense") is None
    table = Completing()
    table.add("n1", "9/0/1", 5.0)
    table.add("n2", "9/1/2", 6.0)
    assert table.ended("n2", "9/0/1") is None, "another node's report does not end it"
    assert table.ended("n1", "9/0/1") is None
    assert table.ended("n2", "9/1/2") == "9"
    assert "9" not in table


# ------------------------------------------------------------------ property

JOB_SHAPES = st.sampled_from([
    {"gpus": 1}, {"gpus": 2}, {"gpus": 0.5}, {"gpus": 0, "cpus": 2},
    {"gpus": 1, "tasks": 2}, {"gpus": 1, "tasks": 3, "min_tasks": 1}, {"gpus": 0.25, "tasks": 2},
])
PROPERTY_POLICY = {"min_runtime": 0, "grace_period": GRACE_S,
                   "departments": [{"name": "d1", "gpu_quota": 3}, {"name": "d2", "gpu_quota": 3}],
                   "projects": [{"name": "a", "department": "d1", "gpu_quota": 1},
                                {"name": "b", "department": "d1", "gpu_quota": 2},
                                {"name": "c", "department": "d2", "gpu_quota": 3}]}
STEPS = st.lists(st.one_of(
    st.tuples(st.just("submit"), st.sampled_from("abc"), JOB_SHAPES, st.sampled_from([50, 50, 75, 100])),
    st.tuples(st.just("cycle")),
    st.tuples(st.just("exit"), st.booleans(), st.integers(0, 1000), st.booleans()),
    st.tuples(st.just("cancel"), st.integers(0, 1000)),
    st.tuples(st.just("silence"), st.integers(0, 2), st.integers(1, 30)),
), min_size=5, max_size=40)


@settings(max_examples=examples(150), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(nodes=st.integers(1, 3), gpus=st.integers(1, 4), steps=STEPS)
def test_no_start_goes_out_while_an_earlier_copy_of_its_job_still_runs(nodes, gpus, steps):
    cluster = make_cluster(nodes, gpus, PROPERTY_POLICY)
    alive: dict[tuple[str, int, int], str] = {}  # what the nodes run: (job, task, attempt) -> node
    doomed: dict[tuple[str, int, int], float] = {}  # what silent nodes run, until their lease stops it
    silent: dict[str, float] = {}  # silent node -> when its lease and grace have stopped all it runs
    submitted: list[str] = []

    def deliver(commands: dict[str, list[dict]]) -> None:
        for node, sent in commands.items():
            for order in sent:
                if order["type"] != "start":
                    continue
                job, attempt = order["job"], order["attempt"]
                older = [k for k in alive if k[0] == job and k[2] != attempt and not current(k)] + \
                        [k for k, end in doomed.items() if k[0] == job and end > cluster.clock.now and not current(k)]
                assert not older, f"job {job} attempt {attempt} starts on {node} while {older} still run"
                if node in silent:  # it may get the start, but its reports never arrive and its lease ends it
                    doomed[(job, order["task"], attempt)] = silent[node]
                    continue
                alive[(job, order["task"], attempt)] = node
                report(cluster, node, order, "running", pid=attempt + 100)

    def heartbeats() -> None:
        for name in cluster.nodes:
            if name not in silent:
                cluster.node_messages.heartbeat(name, None, [{"job": k[0], "task": k[1], "attempt": k[2], "state": "running",
                                                              "pid": k[2] + 100} for k, node in alive.items() if node == name])
        deliver(cluster.outbox.take())
        cluster.node_messages.check_nodes(timeout_s=60)
        deliver(cluster.outbox.take())

    def current(key: tuple[str, int, int]) -> bool:
        job = cluster.jobs.get(key[0])
        return job is not None and job.runs[key[1]].attempt == key[2] and job.runs[key[1]].placement is not None

    for step in steps:
        cluster.clock.now += 1
        if step[0] == "submit":
            _, project, shape, priority = step
            classes = {50: "train", 75: "interactive-preemptible", 100: "build"}
            submitted.append(submit(cluster, project, priority=priority, priority_class=classes[priority], **shape))
        elif step[0] == "cycle":
            heartbeats()
            deliver(cycle(cluster))
        elif step[0] == "exit":
            # A task ends: a copy being stopped is killed, or a wanted one ends by itself (done, or failed).
            _, stopped, pick, ok = step
            keys = sorted(k for k in alive if current(k) != stopped)
            if keys:
                key = keys[pick % len(keys)]
                report(cluster, alive.pop(key), {"job": key[0], "task": key[1], "attempt": key[2]}, "exited",
                       exit_code=0 if ok else 1)
                deliver(cluster.outbox.take())
        elif step[0] == "cancel" and submitted:
            job = cluster.jobs.get(submitted[step[1] % len(submitted)])
            if job is not None:
                cluster.job_service.cancel(job, "u")
            deliver(cluster.outbox.take())
        elif step[0] == "silence" and f"n{step[1] + 1}" in cluster.nodes:
            # A node falls silent for good; its own lease stops what it runs (the stop signal, then the grace).
            name = f"n{step[1] + 1}"
            if name not in silent:
                silent[name] = cluster.nodes[name].last_seen + 60 + GRACE_S
                for key in [k for k, node in alive.items() if node == name]:
                    del alive[key]
                    doomed[key] = silent[name]
            cluster.clock.now += step[2]
            heartbeats()
    cluster.clock.now += 100  # past every silent node's lease and grace
    for _ in range(5):  # the copies being stopped end: whatever waited for them starts, still one at a time
        heartbeats()
        for key in sorted(k for k in alive if not current(k)):
            report(cluster, alive.pop(key), {"job": key[0], "task": key[1], "attempt": key[2]}, "exited",
                   term_signal=9)
            deliver(cluster.outbox.take())
        deliver(cycle(cluster))
    assert not [job for job in cluster.jobs if job in cluster.completing and not any(
        k[0] == job and not current(k) for k in alive)], "a job waits for a copy that has ended"
