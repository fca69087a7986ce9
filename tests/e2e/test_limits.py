"""Limits per user and per project: GPUs held at once, running jobs, pending jobs.

The policy file reads them; the core holds jobs that would pass a GPU or
running limit (and says why, as data in ``gpuctl why``); the controller
refuses a submission that would pass a pending limit, naming it. A
hypothesis property checks over random clusters of every job shape that a
cycle never takes a user or project past a limit it was within.
"""

from __future__ import annotations

import dataclasses
from collections import defaultdict

import pytest
from hypothesis import given, strategies as st

from gpud.core import Scheduler, schedule
from gpud.errors import ConfigError
from gpud.model import JobSpec, NodeSpec, Snapshot, TaskRequest
from gpud.policy import Limits, Policy
from gpud.policy_file import parse_policy
from gpud.simulate import apply_plan

from daemons import LiveCluster
from test_properties import PM, SETTINGS, cases
from test_why import cycle, make_cluster, rules, submit as submit_in_process

USERS = ("alice", "bob", "carol")


def test_the_policy_file_reads_limits_and_names_a_bad_one():
    policy = parse_policy({"limits": {"user_gpus": 4, "user_running_jobs": 2, "user_pending_jobs": 10},
                           "projects": [{"name": "p", "user_gpus": 2, "user_running_jobs": 1,
                                         "user_pending_jobs": 5, "running_jobs": 3, "pending_jobs": 20}]}, "x")
    assert policy.user_limits == Limits(4.0, 2, 10)
    assert policy.projects["p"].user_limits == Limits(2.0, 1, 5)
    assert policy.projects["p"].job_limits == Limits(None, 3, 20)
    with pytest.raises(ConfigError, match='user_gpu: unknown key; did you mean "user_gpus"'):
        parse_policy({"limits": {"user_gpu": 4}}, "x")
    with pytest.raises(ConfigError, match="running_jobs"):
        parse_policy({"projects": [{"name": "p", "running_jobs": -1}]}, "x")


def _holdings(snapshot) -> tuple[dict, dict, dict]:
    """GPUs and running jobs per user, per (project, user), and running jobs per project."""
    gpus: dict = defaultdict(float)
    running: dict = defaultdict(int)
    for job in snapshot.jobs:
        if not job.is_running:
            continue
        held = sum(p.gpu_share * len(p.gpu_index) for p in job.placements if p is not None)
        for key in (("user", job.user), ("member", job.project, job.user)):
            gpus[key] += held
            running[key] += 1
        running[("project", job.project)] += 1
    return gpus, running, {}


@st.composite
def limited(draw):
    """A random case whose jobs have users, under random limits per user and per project."""
    case = draw(cases())
    jobs = tuple(dataclasses.replace(job, user=draw(st.sampled_from(USERS))) for job in case.snapshot.jobs)
    some = st.one_of(st.none(), st.integers(0, 4))
    projects = {name: dataclasses.replace(p, user_limits=Limits(gpus=draw(st.one_of(st.none(), st.sampled_from(
                    [0.5, 1.0, 2.0, 4.0]))), running_jobs=draw(some)), job_limits=Limits(running_jobs=draw(some)))
                for name, p in case.policy.projects.items()}
    policy = dataclasses.replace(case.policy, projects=projects, user_limits=Limits(
        gpus=draw(st.one_of(st.none(), st.sampled_from([1.0, 3.0, 6.0]))), running_jobs=draw(some)))
    return policy, dataclasses.replace(case.snapshot, jobs=jobs)


def _limit(policy: Policy, key: tuple, what: str):
    if key[0] == "user":
        return getattr(policy.user_limits, what)
    if key[0] == "member":
        return getattr(policy.projects[key[1]].user_limits, what)
    return getattr(policy.projects[key[1]].job_limits, what)


@SETTINGS
@given(limited())
def test_a_cycle_never_takes_anyone_past_a_limit(drawn):
    """After a cycle, every user (overall and per project) and project runs and holds no more than its
    limits allow, or no more than it did before the cycle (the limits never stop running jobs)."""
    policy, snapshot = drawn
    after = apply_plan(snapshot, schedule(snapshot, policy, PM))
    gpus_before, running_before, _ = _holdings(snapshot)
    gpus_after, running_after, _ = _holdings(after)
    for key, count in running_after.items():
        most = _limit(policy, key, "running_jobs")
        if most is not None:
            assert count <= max(most, running_before.get(key, 0)), (key, count, most)
    for key, held in gpus_after.items():
        if key[0] == "project":
            continue
        cap = _limit(policy, key, "gpus")
        if cap is not None:
            assert held <= max(cap, gpus_before.get(key, 0.0)) + 1e-9, (key, held, cap)


@SETTINGS
@given(limited())
def test_a_cycle_changes_a_job_only_where_it_runs(drawn):
    """The scheduler kept between cycles knows each job, user included, as it was submitted: a cycle
    changes only its placements and start time (the limits and the user order read the rest)."""
    policy, snapshot = drawn
    scheduler = Scheduler(snapshot, policy, PM)
    scheduler.cycle()
    for job in snapshot.jobs:
        known = scheduler.job(job.id)
        assert known == dataclasses.replace(job, placements=known.placements, started=known.started)


def test_a_users_next_job_starts_once_the_running_one_finishes():
    policy = parse_policy({"projects": [{"name": "p", "gpu_quota": 4, "user_running_jobs": 1}]}, "x")
    scheduler = Scheduler(Snapshot(nodes=(NodeSpec("n1", gpus=4, cpus=32, memory_gib=128.0),), jobs=(), now=0.0),
                          policy, PM)
    for n in (1, 2):
        scheduler.submit(JobSpec(f"j{n}", "p", TaskRequest(gpus=1), submitted=float(n), seq=n, user="alice"))
    assert [bind.job for bind in scheduler.cycle(1.0).binds] == ["j1"]
    assert scheduler.cycle(2.0).pending["j2"].blocker.rule == "running_jobs"
    scheduler.finish("j1")
    assert [bind.job for bind in scheduler.cycle(3.0).binds] == ["j2"]


def test_why_names_a_users_running_and_gpu_limits_as_data():
    cluster = make_cluster({"limits": {"user_gpus": 3},
                            "projects": [{"name": "p", "gpu_quota": 8, "user_running_jobs": 1}]},
                           [("n1", 8, 64)])
    first = submit_in_process(cluster, "p", gpus=2)
    second = submit_in_process(cluster, "p", gpus=2)
    cycle(cluster)
    assert first.state == "RUNNING" and second.state == "PENDING"
    from gpud.controller.why import explain
    answer = explain(second, cluster)
    limits = [b for b in answer["blockers"] if b["rule"] == "user_limit"]
    assert {b["limit"] for b in limits} == {"user_running_jobs", "[limits] user_gpus"}
    running = next(b for b in limits if b["limit"] == "user_running_jobs")
    assert (running["user"], running["running"], running["most"]) == ("u", 1, 1)
    gpus = next(b for b in limits if b["limit"] == "[limits] user_gpus")
    assert (gpus["held"], gpus["gpu_limit"], gpus["need"]) == (2, 3, 2)
    both = next(c for c in answer["would_start"] if c["condition"] == "all_of")  # each alone would not start it
    assert [c["condition"] for c in both["conditions"]] == ["user_runs_fewer", "user_holds_at_most"]
    assert "user u runs 1 job in project p" in answer["reason"]
    assert "scheduler" in rules(answer)


def test_a_job_larger_than_a_user_may_hold_can_never_start():
    cluster = make_cluster({"projects": [{"name": "p", "gpu_quota": 8, "user_gpus": 2}]}, [("n1", 8, 64)])
    job = submit_in_process(cluster, "p", gpus=4)
    cycle(cluster)
    from gpud.controller.why import explain
    answer = explain(job, cluster)
    assert job.state == "PENDING" and answer["never"] is True
    assert [c["condition"] for c in answer["would_start"]] == ["user_limit_at_least"]


LIMITED_POLICY = """\
[limits]
user_pending_jobs = 5

[[projects]]
name = "alpha"
gpu_quota = 2
user_pending_jobs = 2

[[projects]]
name = "beta"
pending_jobs = 3
"""


@pytest.fixture(scope="module")
def live(tmp_path_factory):
    cluster = LiveCluster(tmp_path_factory.mktemp("limits"), policy=LIMITED_POLICY)
    try:
        cluster.start_controller()  # no node: every job stays pending
        cluster.alice = cluster.token_for("alice")
        cluster.bob = cluster.token_for("bob")
        yield cluster
    finally:
        cluster.close()


def _post(cluster: LiveCluster, token: str, **job) -> tuple[int, dict]:
    body = {"project": "alpha", "workdir": str(cluster.workdir), "command": ["true"], "gpus": 1, **job}
    return cluster.api("POST", "/api/v1/jobs", body, token=token)


def test_a_submit_past_a_pending_limit_is_refused_naming_it(live):
    for _ in range(2):
        status, body = _post(live, live.alice)
        assert status == 201, body
    status, body = _post(live, live.alice)
    assert status == 429
    assert "user alice may have at most 2 pending jobs in project alpha (user_pending_jobs)" in body["error"]
    status, body = _post(live, live.bob)  # the limit is each user's
    assert status == 201, body
    status, body = _post(live, live.bob, project="beta", array="0-2")  # three at once: beta's whole limit
    assert status == 201, body
    status, body = _post(live, live.alice, project="beta")
    assert status == 429 and "project beta may have at most 3 pending jobs (pending_jobs)" in body["error"]
    status, body = _post(live, live.bob, array="0-5")
    assert status == 429 and "pending jobs" in body["error"]
    assert live.controller is not None and live.controller.alive()


def test_a_live_controller_starts_a_users_jobs_one_after_another(tmp_path):
    """The controller's scheduler is kept between cycles: under user_running_jobs = 1 a user's jobs
    run one at a time, each starting once the one before has finished."""
    cluster = LiveCluster(tmp_path, policy='[[projects]]\nname = "alpha"\ngpu_quota = 4\nuser_running_jobs = 1\n')
    try:
        cluster.start_controller()
        cluster.start_node("n1", gpus=4)
        user = cluster.token_for("nobody")  # an account every node has
        ids = [cluster.submit(token=user, command=["sleep", "0.5"], gpus=1, workdir="/tmp", output="/dev/null")
               for _ in range(3)]
        jobs = [cluster.wait_state(job_id, "COMPLETED") for job_id in ids]
        for before, after in zip(jobs, jobs[1:]):
            assert after["started"] >= before["ended"], (before, after)
    finally:
        cluster.close()
