"""`gpuctl why` on the controller's state: blockers and "would start if" as data, and never advice that cannot work."""

from __future__ import annotations

from gpud.cli.job_cmd import why_text
from gpud.controller.cluster import Cluster
from gpud.controller.nodes import Gpu, NodeRecord
from gpud.controller.persist import Persister
from gpud.controller.why import explain
from gpud.jobs import Job
from gpud.lifecycle import PENDING
from gpud.plugins import make_plugin_manager
from gpud.policy_file import parse_policy
from gpud.submission import Submission


def make_cluster(policy: dict, nodes: list[tuple[str, int, float]]) -> Cluster:
    cluster = Cluster(parse_policy({"min_runtime": 0, "grace_period": 5, **policy}, "test"), make_plugin_manager(),
                      Persister(None, None), lambda: 1000.0)
    for name, gpus, cpus in nodes:
        cluster.node_messages.register(NodeRecord(name, cpus=cpus, memory_gib=256,
                                                  gpus=[Gpu(i, f"GPU-{name}-{i}") for i in range(gpus)]), tasks=[])
    cluster.outbox.take()
    return cluster


def submit(cluster: Cluster, project: str, **fields) -> Job:
    job = Job(id="", user="u", project=project, workdir="/tmp", command=["true"], **fields)
    job_id = cluster.job_service.submit([Submission(job)], {})[0]
    return cluster.jobs[job_id]


def cycle(cluster: Cluster) -> None:
    scheduler = cluster.core.prepare((n.spec() for n in cluster.nodes.values()),
                                     lambda: (cluster.jobs[i].spec() for i in sorted(cluster.core.in_core)),
                                     cluster.clock())
    plan, skip = cluster.core.finished(scheduler.cycle(cluster.clock()))
    cluster.plans.apply(plan, skip)
    cluster.outbox.take()


def rules(answer: dict) -> list[str]:
    return [b["rule"] for b in answer["blockers"]]


def conditions(answer: dict) -> list[str]:
    return [c["condition"] for c in answer["would_start"]]


def test_a_non_preemptible_job_larger_than_its_quota_can_never_start_and_says_who_can_change_that():
    cluster = make_cluster({"projects": [{"name": "small", "gpu_quota": 2}]}, [("n1", 8, 64)])
    job = submit(cluster, "small", gpus=3, priority=100)
    cycle(cluster)
    answer = explain(job, cluster)
    assert job.state == PENDING and answer["never"] is True
    quota = next(b for b in answer["blockers"] if b["rule"] == "quota")
    assert (quota["quota"], quota["need"], quota["never"]) == (2, 3, True)
    raise_quota = next(c for c in answer["would_start"] if c["condition"] == "quota_at_least")
    assert (raise_quota["who"], raise_quota["name"], raise_quota["gpu"]) == ("admin", "small", 3)
    assert "preemptible" in conditions(answer)
    assert not any("at most 0" in c["message"] for c in answer["would_start"])
    assert "can never start" in why_text(answer)


def test_a_gang_blocked_per_task_names_the_gang_and_the_nodes_that_could_hold_a_task():
    cluster = make_cluster({"projects": [{"name": "p", "gpu_quota": 16}]}, [("n1", 4, 64), ("n2", 4, 64)])
    fillers = [submit(cluster, "p", gpus=3, priority=100) for _ in range(2)]
    cycle(cluster)
    assert all(f.state != PENDING for f in fillers)
    gang = submit(cluster, "p", gpus=2, tasks=4)
    cycle(cluster)
    answer = explain(gang, cluster)
    blocker = next(b for b in answer["blockers"] if b["rule"] == "gang")
    assert (blocker["tasks"], blocker["per_task"]["gpu"], blocker["nodes_holding_a_task_now"]) == (4, 2, 0)
    assert "gang of 4 tasks" in blocker["message"]
    room = next(c for c in answer["would_start"] if c["condition"] == "task_room")
    assert room["tasks"] == 4 and answer["never"] is False
    assert not any(c["condition"] == "node_frees" for c in answer["would_start"])


def test_a_gang_larger_than_the_pool_can_never_start():
    cluster = make_cluster({"projects": [{"name": "p", "gpu_quota": 16}]}, [("n1", 4, 64), ("n2", 4, 64)])
    gang = submit(cluster, "p", gpus=3, tasks=3)
    cycle(cluster)
    answer = explain(gang, cluster)
    assert answer["never"] is True
    blocker = next(b for b in answer["blockers"] if b["rule"] == "gang")
    assert blocker["tasks_room_ever"] == 2
    assert {"more_nodes", "fewer_tasks"} <= set(conditions(answer))


def test_a_project_at_its_limit_is_told_about_its_limit_not_idle_gpus():
    cluster = make_cluster({"projects": [{"name": "p", "gpu_quota": 1, "gpu_limit": 2}]}, [("n1", 8, 64)])
    running = [submit(cluster, "p", gpus=1) for _ in range(2)]
    cycle(cluster)
    assert all(r.state != PENDING for r in running)
    job = submit(cluster, "p", gpus=1)
    cycle(cluster)
    answer = explain(job, cluster)
    assert "limit" in rules(answer)
    assert "idle_gpus" not in conditions(answer)
    holds = next(c for c in answer["would_start"] if c["condition"] == "level_holds_at_most")
    assert (holds["name"], holds["gpu"]) == ("p", 1)


def test_a_job_short_of_cpus_is_told_about_cpus_and_what_would_free_them():
    cluster = make_cluster({"projects": [{"name": "p", "gpu_quota": 8}]}, [("n1", 8, 8)])
    filler = submit(cluster, "p", gpus=0, cpus=7)
    cycle(cluster)
    assert filler.state != PENDING
    job = submit(cluster, "p", gpus=1, cpus=2)
    cycle(cluster)
    answer = explain(job, cluster)
    room = next(b for b in answer["blockers"] if b["rule"] == "node_room")
    assert room["short"]["cpu"] == 1 and room["short"]["gpu"] == 0
    frees = next(c for c in answer["would_start"] if c["condition"] == "node_frees")
    assert (frees["node"], frees["cpu"], frees["gpu"]) == ("n1", 1, 0)
    assert "1 CPUs freeing on node n1" in why_text(answer)


def test_a_job_held_back_by_its_limit_and_a_full_node_gets_one_condition_for_both():
    cluster = make_cluster({"projects": [{"name": "p", "gpu_quota": 0, "gpu_limit": 3},
                                         {"name": "q", "gpu_quota": 4}]}, [("n1", 4, 64)])
    mine = submit(cluster, "p", gpus=2)
    theirs = submit(cluster, "q", gpus=2, priority=100)
    cycle(cluster)
    assert mine.state != PENDING and theirs.state != PENDING
    job = submit(cluster, "p", gpus=2)
    cycle(cluster)
    answer = explain(job, cluster)
    assert {"limit", "node_room"} <= set(rules(answer))
    assert conditions(answer) == ["all_of"]
    parts = answer["would_start"][0]["conditions"]
    assert [c["condition"] for c in parts] == ["level_holds_at_most", "node_frees"]
    assert (parts[0]["gpu"], parts[1]["node"], parts[1]["gpu"]) == (1, "n1", 2)


def test_the_scheduler_gives_its_blocker_as_data_and_why_words_it():
    cluster = make_cluster({"projects": [{"name": "p", "gpu_quota": 16}]}, [("n1", 4, 64), ("n2", 4, 64), ("n3", 4, 64)])
    fillers = [submit(cluster, "p", gpus=gpus, priority=100) for gpus in (2, 3, 3)]
    cycle(cluster)
    assert all(filler.state != PENDING for filler in fillers)  # 2, 1 and 1 GPUs free
    wide = submit(cluster, "p", gpus=3, tasks=2)
    cycle(cluster)
    answer = explain(wide, cluster)
    scheduler = next(b for b in answer["blockers"] if b["rule"] == "scheduler")
    blocker = scheduler["blocker"]
    assert (blocker["rule"], blocker["resource"], blocker["pool"]) == ("shortage", "gpu", "default")
    assert (blocker["free"], blocker["need"]["gpu"]) == (4, 6)
    assert scheduler["queue"]["name"] == "p" and scheduler["queue"]["allocated"]["gpu"] == 8
    assert scheduler["message"] == answer["reason"] == cluster.waits.reason_of(wide)
    assert answer["reason"].endswith("waiting for GPUs: pool default has 4 free, the job needs 6")
    gang = submit(cluster, "p", gpus=2, tasks=2)
    cycle(cluster)
    blocker = next(b for b in explain(gang, cluster)["blockers"] if b["rule"] == "scheduler")["blocker"]
    assert (blocker["rule"], blocker["tasks"], blocker["nodes_holding_a_task_now"]) == ("gang", 2, 1)
    assert blocker["per_task"]["gpus"] == 2 and "waiting for gang members" in blocker["message"]
    assert "1 node could hold one now" in blocker["message"]


def test_where_the_project_stands_is_not_listed_as_a_blocker():
    """A job short of CPUs is blocked by CPUs; its project's GPU share is context, shown apart."""
    cluster = make_cluster({"projects": [{"name": "p", "gpu_quota": 8}]}, [("n1", 8, 8)])
    submit(cluster, "p", gpus=0, cpus=7)
    cycle(cluster)
    job = submit(cluster, "p", gpus=1, cpus=2)
    cycle(cluster)
    answer = explain(job, cluster)
    assert "share" not in rules(answer)
    assert [s["rule"] for s in answer["standing"]] == ["share"]
    text = why_text(answer)
    blocked = text.split("Blocked by:")[1].split("\n\n")[0]
    assert "this job needs" not in blocked and "node n1 lacks 1 CPUs" in blocked, text
    assert "Where it stands:\n  - project p in pool default: 0 GPUs allocated" in text


def test_an_array_element_held_by_its_limit_lists_that_limit():
    cluster = make_cluster({"projects": [{"name": "p", "gpu_quota": 8}]}, [("n1", 8, 64)])
    job = Job(id="", user="u", project="p", workdir="/tmp", command=["true"], gpus=1)
    ids = cluster.job_service.submit([Submission(job, (0, 1, 2), 1)], {})
    cycle(cluster)
    held = cluster.jobs[ids[1]]
    answer = explain(held, cluster)
    assert rules(answer) == ["array_limit"], answer
    assert (answer["blockers"][0]["limit"], answer["blockers"][0]["queued"]) == (1, 1)
    assert conditions(answer) == ["array_element_ends"]
    assert "its limit (%1)" in why_text(answer) and "this job needs" not in why_text(answer)


def test_a_job_with_a_constraint_is_told_about_the_constraint():
    cluster = make_cluster({"projects": [{"name": "p", "gpu_quota": 8}]}, [("big", 8, 64)])
    cluster.node_messages.register(NodeRecord("small", cpus=64, memory_gib=256, labels={"kind": "small"},
                                              gpus=[Gpu(0, "GPU-small-0")]), tasks=[])
    cluster.outbox.take()
    job = submit(cluster, "p", gpus=2, constraint={"kind": "small"})
    cycle(cluster)
    answer = explain(job, cluster)
    size = next(b for b in answer["blockers"] if b["rule"] == "node_size")
    assert "matches constraint kind=small" in size["message"] and size["constraint"] == {"kind": "small"}
    assert "matches constraint kind=small" in answer["reason"], answer["reason"]
    assert any("another --constraint" in c["message"] for c in answer["would_start"])


def test_a_never_answer_does_not_say_it_would_start():
    cluster = make_cluster({"projects": [{"name": "small", "gpu_quota": 2}]}, [("n1", 8, 64)])
    job = submit(cluster, "small", gpus=3, priority=100)
    cycle(cluster)
    text = why_text(explain(job, cluster))
    assert "It can never start under the policy as it stands. Only these changes would let it:" in text
    assert "It would start if" not in text


def test_a_reclaim_held_back_by_the_minimum_run_time_says_when_it_is_due():
    now = [1000.0]
    cluster = Cluster(parse_policy({"min_runtime": 60, "grace_period": 5, "projects": [
        {"name": "lab", "gpu_quota": 2}, {"name": "guest", "gpu_quota": 0}]}, "test"), make_plugin_manager(),
        Persister(None, None), lambda: now[0])
    cluster.node_messages.register(NodeRecord("n1", cpus=64, memory_gib=256, gpus=[Gpu(i, f"GPU-{i}") for i in range(2)]),
                                   tasks=[])
    cluster.outbox.take()
    guest = submit(cluster, "guest", gpus=2)
    cycle(cluster)
    assert guest.state != PENDING
    now[0] = 1010.0
    job = submit(cluster, "lab", gpus=1)
    cycle(cluster)
    answer = explain(job, cluster)
    assert job.state == PENDING and not answer["never"]
    [due] = answer["expected"]
    assert (due["event"], due["jobs"], due["at"]) == ("reclaim_due", [guest.id], guest.started + 60)
    assert "minimum run time of 60 s, in 50 s" in due["message"]
    assert "Expected:\n  - a reclaim is due" in why_text(answer)
    now[0] = guest.started + 60 + 1  # what it said: the reclaim comes once the victim is old enough
    cycle(cluster)
    assert (job.state, guest.state) == ("RUNNING", PENDING)


def test_a_constraint_and_a_size_no_matching_node_holds_are_refused_at_submit():
    import pytest

    from gpud.submission import SubmitError, admit, read_job
    cluster = make_cluster({"projects": [{"name": "p", "gpu_quota": 8}]}, [("big", 8, 64)])
    cluster.node_messages.register(NodeRecord("small", cpus=4, memory_gib=16, labels={"kind": "small", "rack": "r1"},
                                              gpus=[Gpu(0, "GPU-small-0")]), tasks=[])

    def check(**fields):
        return admit(read_job({"project": "p", "workdir": "/tmp", "command": ["true"], **fields}), user="u",
                     admin=False, policy=cluster.policy, capacity=cluster.node_messages.largest_node())
    with pytest.raises(SubmitError) as refused:
        check(gpus=2, constraint={"kind": "small"})
    assert refused.value.field == "constraint"
    assert "the largest node with kind=small has 1" in str(refused.value)
    with pytest.raises(SubmitError) as refused:
        check(gpus=1, cpus=8, constraint={"rack": "r1"})
    assert "8 CPUs but the largest node with rack=r1 has 4" in str(refused.value)
    assert check(gpus=1, constraint={"kind": "small"}).job.constraint == {"kind": "small"}
    assert check(gpus=8).job.gpus == 8  # without a constraint, the big node holds it
