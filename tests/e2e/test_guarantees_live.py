"""The quota guarantees for every job shape, on a live cluster, as a user meets them.

A real `gpud controller` and `gpud node` daemons with fake GPUs run as
processes on 127.0.0.1 (tests/daemons.py); jobs are submitted and read with
`gpuctl`, as a user would. One cluster per case, each with its own policy:
gangs reclaim (1), victims come from two projects (2), an elastic gang grows
by reclaim (3), consolidation moves the newer job (4), fractional CPUs fill a
node (5), and `gpuctl why --json` gives only advice that can work (6).
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

if importlib.util.find_spec("gpud.cli.controller_cmd") is None:
    pytest.skip("the live tests need `gpud controller`", allow_module_level=True)

from daemons import LiveCluster, wait_for  # noqa: E402  (after the skip: it needs the daemons)

SETTLE_S = 30.0  # cycles run every second; evicted tasks get a 1 s grace period


def policy(projects: str) -> str:
    """A policy for a quick live case: no minimum run time, a short grace period."""
    return f"grace_period = 1\nmin_runtime = 0\n\n{projects}"


@pytest.fixture
def live(tmp_path: Path) -> Iterator[list[LiveCluster]]:
    """Clusters the test starts (one at a time); every process stopped by pid after."""
    started: list[LiveCluster] = []
    try:
        yield started
    finally:
        for cluster in started:
            cluster.close()


def start(live: list[LiveCluster], root: Path, projects: str, nodes: list[tuple[str, int]],
          cpus: float = 64.0) -> LiveCluster:
    cluster = LiveCluster(root, policy(projects))
    live.append(cluster)
    cluster.start_controller()
    for name, gpus in nodes:
        cluster.start_node(name, gpus=gpus, cpus=cpus, memory_gib=256)
    return cluster


def gpuctl(cluster: LiveCluster, *args: str) -> str:
    """Run gpuctl as a user would; its output (it must succeed)."""
    env = {**os.environ, "GPUD_URL": cluster.url, "GPUD_TOKEN": cluster.admin_token, "GPUD_TIMEOUT": "10",
           "XDG_CONFIG_HOME": str(cluster.root / "no-config")}
    env.pop("GPUD_PROJECT", None)
    result = subprocess.run([sys.executable, "-m", "gpud.cli.gpuctl", *args], env=env, capture_output=True,
                            text=True, timeout=60, cwd=cluster.workdir)
    assert result.returncode == 0, f"gpuctl {' '.join(args)}: exit {result.returncode}: {result.stderr}"
    return result.stdout


def submit(cluster: LiveCluster, project: str, *args: str) -> list[str]:
    """Submit with gpuctl (light tasks: a tenth of a CPU, 64 MiB); the new job ids."""
    out = gpuctl(cluster, "submit", "--parsable", "-p", project, "--cpus", "0.1", "--mem", "64M", *args,
                 "--", "sleep", "600")
    return out.split()


def running_tasks(job: dict) -> int:
    return sum(1 for p in job.get("placements") or [] if p is not None)


def states(cluster: LiveCluster, ids: list[str]) -> dict[str, str]:
    return {i: cluster.job(i)["state"] for i in ids}


def all_running(cluster: LiveCluster, ids: list[str]) -> None:
    wait_for(lambda: set(states(cluster, ids).values()) == {"RUNNING"}, f"jobs {ids} to run", SETTLE_S)


def test_a_gang_reclaims_as_a_single_task_does(live, tmp_path):
    cluster = start(live, tmp_path, """
[[projects]]
name = "hog"
gpu_quota = 2

[[projects]]
name = "owner"
gpu_quota = 6
""", [("n1", 8)])
    hog = [submit(cluster, "hog", "--gpus", "1")[0] for _ in range(8)]
    all_running(cluster, hog)
    (gang,) = submit(cluster, "owner", "--tasks", "2", "--gpus", "2")
    job = cluster.wait_state(gang, "RUNNING", timeout=SETTLE_S)
    assert running_tasks(job) == 2
    wait_for(lambda: list(states(cluster, hog).values()).count("RUNNING") == 4, "hog back to its fair share",
             SETTLE_S)
    assert sorted(states(cluster, hog).values()) == ["PENDING"] * 4 + ["RUNNING"] * 4


def test_victims_come_from_two_projects_over_their_fair_share(live, tmp_path):
    cluster = start(live, tmp_path, """
[[projects]]
name = "a"
gpu_quota = 1

[[projects]]
name = "b"
gpu_quota = 1

[[projects]]
name = "owner"
gpu_quota = 3
""", [("n1", 8)])
    a = [submit(cluster, "a", "--gpus", "1")[0] for _ in range(5)]
    all_running(cluster, a)
    b = [submit(cluster, "b", "--gpus", "1")[0] for _ in range(3)]
    all_running(cluster, b)
    (owner,) = submit(cluster, "owner", "--gpus", "3")
    cluster.wait_state(owner, "RUNNING", timeout=SETTLE_S)
    wait_for(lambda: (list(states(cluster, a).values()).count("RUNNING"),
                      list(states(cluster, b).values()).count("RUNNING")) == (3, 2),
             "a at 3 GPUs and b at 2", SETTLE_S)
    # The most recently started of each go: a's last two, b's last one.
    assert [s for i, s in states(cluster, a).items()] == ["RUNNING"] * 3 + ["PENDING"] * 2
    assert [s for i, s in states(cluster, b).items()] == ["RUNNING"] * 2 + ["PENDING"]


def test_an_elastic_gang_grows_by_reclaim_to_its_fair_share(live, tmp_path):
    cluster = start(live, tmp_path, """
[[projects]]
name = "hog"
gpu_quota = 2

[[projects]]
name = "owner"
gpu_quota = 4
""", [("n1", 8)])
    (hog,) = submit(cluster, "hog", "--tasks", "7", "--min-tasks", "2", "--gpus", "1")
    wait_for(lambda: running_tasks(cluster.job(hog)) == 7, "hog's 7 tasks to run", SETTLE_S)
    (owner,) = submit(cluster, "owner", "--tasks", "4", "--min-tasks", "1", "--gpus", "1")
    wait_for(lambda: running_tasks(cluster.job(owner)) == 4, "owner's elastic gang to grow to 4 tasks", SETTLE_S)
    assert running_tasks(cluster.job(hog)) == 4 and cluster.job(hog)["state"] == "RUNNING"


def test_consolidation_moves_the_newer_of_two_equal_jobs(live, tmp_path):
    cluster = start(live, tmp_path, """
[[projects]]
name = "p"
gpu_quota = 8
""", [("n1", 2), ("n2", 2)])

    def node_of(job_id: str) -> str:
        return cluster.job(job_id)["placements"][0]["node"]

    (old,) = submit(cluster, "p", "--gpus", "1")
    cluster.wait_state(old, "RUNNING", timeout=SETTLE_S)
    (filler,) = submit(cluster, "p", "--gpus", "1")
    cluster.wait_state(filler, "RUNNING", timeout=SETTLE_S)
    (new,) = submit(cluster, "p", "--gpus", "1")
    cluster.wait_state(new, "RUNNING", timeout=SETTLE_S)
    assert node_of(old) == node_of(filler) != node_of(new)  # bin-packing filled old's node first
    gpuctl(cluster, "cancel", filler)
    cluster.wait_state(filler, "CANCELLED", timeout=SETTLE_S)
    old_node = node_of(old)
    (big,) = submit(cluster, "p", "--gpus", "2")
    cluster.wait_state(big, "RUNNING", timeout=SETTLE_S)
    wait_for(lambda: cluster.job(new)["state"] == "RUNNING" and node_of(new) == old_node,
             "the newer job to run again beside the old one", SETTLE_S)
    assert node_of(old) == old_node and node_of(big) != old_node
    assert cluster.job(old)["restart_count"] == 0 and cluster.job(new)["restart_count"] == 1


def test_fractional_cpus_fill_a_node(live, tmp_path):
    cluster = start(live, tmp_path, """
[[projects]]
name = "p"
""", [("n1", 0)], cpus=2)
    out = gpuctl(cluster, "submit", "--parsable", "-p", "p", "--gpus", "0", "--cpus", "0.0625", "--mem", "16M",
                 "--array", "0-39", "--", "sleep", "600")
    array = out.split()[0]

    def counts() -> tuple[int, int]:
        status, body = cluster.api("GET", "/api/v1/jobs?state=PENDING,RUNNING")
        mine = [j for j in body["jobs"] if j.get("project") == "p"]
        return (sum(1 for j in mine if j["state"] == "RUNNING"), sum(1 for j in mine if j["state"] == "PENDING"))

    wait_for(lambda: counts() == (32, 8), "32 jobs of 1/16 CPU to run on the 2-CPU node", SETTLE_S)
    status, body = cluster.api("GET", "/api/v1/jobs?state=PENDING")
    reasons = {j["reason"] for j in body["jobs"] if j.get("project") == "p"}
    assert reasons and all("waiting for CPUs" in r for r in reasons), reasons
    assert not any("fragmented" in r for r in reasons)
    assert array


def test_why_gives_only_advice_that_can_work(live, tmp_path):
    cluster = start(live, tmp_path, """
[[projects]]
name = "small"
gpu_quota = 2

[[projects]]
name = "p"
gpu_quota = 8
""", [("n1", 4), ("n2", 4)])
    fillers = [submit(cluster, "p", "--gpus", "3", "--priority", "build")[0] for _ in range(2)]
    all_running(cluster, fillers)
    (wide,) = submit(cluster, "small", "--gpus", "3", "--priority", "build")
    (gang,) = submit(cluster, "p", "--tasks", "4", "--gpus", "2")

    def why(job_id: str) -> dict:
        answer = json.loads(gpuctl(cluster, "why", "--json", job_id))
        return answer if any(b["rule"] == "scheduler" for b in answer["blockers"]) else {}

    # A non-preemptible job larger than its project's quota can never start, and says who can change that.
    answer = wait_for(lambda: why(wide), "a cycle to judge the non-preemptible job", SETTLE_S)
    assert answer["state"] == "PENDING" and answer["never"] is True
    quota = next(b for b in answer["blockers"] if b["rule"] == "quota")
    assert (quota["quota"], quota["need"]) == (2, 3)
    conditions = {c["condition"]: c for c in answer["would_start"]}
    assert conditions["quota_at_least"]["who"] == "admin" and conditions["quota_at_least"]["gpu"] == 3
    assert "preemptible" in conditions
    assert not any("at most 0" in c["message"] for c in answer["would_start"])
    scheduler = next(b for b in answer["blockers"] if b["rule"] == "scheduler")
    assert scheduler["blocker"]["rule"] == "quota" and scheduler["blocker"]["name"] == "small"
    assert (scheduler["blocker"]["bound"]["gpu"], scheduler["blocker"]["need"]["gpu"]) == (2, 3)
    # A gang no node has room for per task names the gang: tasks x per-task need and the nodes that could hold one.
    answer = wait_for(lambda: why(gang), "a cycle to judge the gang", SETTLE_S)
    gang_blocker = next(b for b in answer["blockers"] if b["rule"] == "gang")
    assert (gang_blocker["tasks"], gang_blocker["per_task"]["gpu"], gang_blocker["nodes_holding_a_task_now"]) == (
        4, 2, 0)
    assert "gang of 4 tasks" in gang_blocker["message"]
    assert any(c["condition"] == "task_room" for c in answer["would_start"]) and answer["never"] is False
    text = gpuctl(cluster, "why", gang)
    assert "gang of 4 tasks" in text and "It would start if:" in text
