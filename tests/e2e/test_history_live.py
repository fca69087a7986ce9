"""Fair share with history on a real controller: the usage it charges reaches the scheduler.

Two projects without quota share a 4-GPU node. One of them has just used the
whole node; when both then ask for every GPU at once, history (on) gives the
other project more of the surplus, and with history off they split it evenly.
"""

from __future__ import annotations


import pytest

from daemons import LiveCluster, wait_for

POLICY = """\
grace_period = 1
min_runtime = 0
usage_half_life = 0
usage_charge_interval = 0.2

[fair_share]
history = {history}
strength = 1
entry_penalty = 0

[[projects]]
name = "used"
gpu_quota = 0

[[projects]]
name = "fresh"
gpu_quota = 0
"""


def usage_of(cluster: LiveCluster, project: str) -> float:
    status, body = cluster.api("GET", "/api/v1/usage")
    assert status == 200, body
    rows = {(r["level"], r["name"]): r for r in body["rows"]}
    row = rows.get(("project", project))
    return row["gpu_hours"] * 3600 if row else 0.0


def running_gpus(cluster: LiveCluster, jobs: list[str]) -> int:
    return sum(1 for job in jobs if cluster.job(job)["state"] == "RUNNING")


@pytest.mark.parametrize("history, used_gets", [("true", 1), ("false", 2)])
def test_a_project_that_just_used_the_node_gets_less_of_it_with_history(tmp_path, history, used_gets):
    cluster = LiveCluster(tmp_path, policy=POLICY.format(history=history))
    try:
        cluster.start_controller()
        cluster.start_node("n1", gpus=4)
        hog = cluster.submit(command=["sleep", "2"], gpus=4, project="used")
        cluster.wait_state(hog, "COMPLETED")
        wait_for(lambda: usage_of(cluster, "used") > 7.0, "the used project's GPU-seconds to be charged")
        cluster.wait_cycles(1)  # a charge after the job's end has reached the scheduler
        # One batch: a cycle between separate submits would give the whole node to whoever came first.
        batch = [{"command": ["sleep", "60"], "gpus": 1, "project": project, "workdir": str(cluster.workdir)}
                 for project in ["used"] * 4 + ["fresh"] * 4]
        status, body = cluster.api("POST", "/api/v1/jobs/batch", {"jobs": batch})
        assert status == 201, (status, body)
        used, fresh = body["ids"][:4], body["ids"][4:]
        split = (used_gets, 4 - used_gets)
        wait_for(lambda: (running_gpus(cluster, used), running_gpus(cluster, fresh)) == split,
                 f"the node split {split} between the used and the fresh project")
        cluster.wait_cycles(2)  # and it stays so: no reclaim back and forth
        assert (running_gpus(cluster, used), running_gpus(cluster, fresh)) == split
    finally:
        cluster.close()
