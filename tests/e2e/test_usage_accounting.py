"""Decayed usage through a real controller, real node daemons and the real SQLite store.

Jobs really run for a few seconds on fake GPUs; the usage the controller
charges while they run is read back through the API, across a kill -9.
"""

from __future__ import annotations

import signal
import sqlite3
import time
import urllib.request

import pytest

from daemons import POLICY, LiveCluster, wait_for
from gpud.gpu.fake import MEMORY_GIB as FAKE_GPU_GIB

INTERVAL_S = 0.5
USAGE_POLICY = f"usage_half_life = 0\nusage_charge_interval = {INTERVAL_S}\n" + POLICY


@pytest.fixture
def cluster(live_cluster):
    return live_cluster(USAGE_POLICY)


def usage(cluster: LiveCluster, token: str | None = "admin", **query: str) -> dict:
    path = "/api/v1/usage" + ("?" + "&".join(f"{k}={v}" for k, v in query.items()) if query else "")
    status, body = cluster.api("GET", path, token=token)
    assert status == 200, body
    return {(r["level"], r["pool"], r["name"]): r for r in body["rows"]}


def gpu_seconds(cluster: LiveCluster, level: str, name: str) -> float:
    return usage(cluster)[(level, "default", name)]["gpu_hours"] * 3600


def job_gpu_seconds(cluster: LiveCluster, job_id: str) -> float:
    return cluster.job(job_id)["gpu_hours"] * 3600


def test_running_jobs_are_charged_their_gpus_fractions_cpus_and_memory(cluster):
    cluster.start_node("n1", gpus=4)
    submitted = time.time()
    whole = cluster.submit(command=["sleep", "3"], gpus=2, cpus=2, memory_gib=4)
    half = cluster.submit(command=["sleep", "3"], gpus=0.5, project="beta")
    quarter = cluster.submit(command=["sleep", "3"], gpu_memory_gib=FAKE_GPU_GIB / 4, project="beta")
    cluster.wait_state(whole, "RUNNING")
    # Charged while it runs, not only at its end.
    wait_for(lambda: gpu_seconds(cluster, "project", "alpha") > 2.0, "alpha to be charged while its job runs",
             timeout=3.0)
    assert cluster.job(whole)["state"] == "RUNNING"
    cluster.wait_state(whole, "COMPLETED")
    cluster.wait_state(half, "COMPLETED")
    cluster.wait_state(quarter, "COMPLETED")
    window = time.time() - submitted
    rows = usage(cluster)
    alpha, beta = rows[("project", "default", "alpha")], rows[("project", "default", "beta")]
    # Each job ran its 3 s sleep, and no longer than the test saw it go from submitted to completed (bounds a
    # busy host cannot break, as it can stretch a run past any fixed figure).
    ran = {job_id: cluster.job(job_id)["elapsed_s"] for job_id in (whole, half, quarter)}
    assert all(3.0 - 0.01 <= seconds <= window for seconds in ran.values()), (ran, window)
    # A 2-GPU job is charged twice its run: exactly what the job itself records, from placement to exit.
    assert alpha["gpu_hours"] * 3600 == pytest.approx(2 * ran[whole], abs=0.02)
    assert alpha["gpu_hours"] * 3600 == pytest.approx(job_gpu_seconds(cluster, whole), abs=0.05)
    assert alpha["cpu_hours"] * 3600 == pytest.approx(alpha["gpu_hours"] * 3600, rel=0.02)      # 2 CPUs
    assert alpha["memory_gib_hours"] * 3600 == pytest.approx(2 * alpha["gpu_hours"] * 3600, rel=0.02)  # 4 GiB
    # Half a GPU counts half; a slice of a quarter of a GPU's memory a quarter.
    assert job_gpu_seconds(cluster, half) == pytest.approx(0.5 * ran[half], abs=0.01)
    assert job_gpu_seconds(cluster, quarter) == pytest.approx(0.25 * ran[quarter], abs=0.01)
    assert beta["gpu_hours"] * 3600 == pytest.approx(job_gpu_seconds(cluster, half)
                                                     + job_gpu_seconds(cluster, quarter), abs=0.05)
    # The department holds both projects' usage, each user theirs in that project.
    research = rows[("department", "default", "research")]
    assert research["gpu_hours"] == pytest.approx(alpha["gpu_hours"] + beta["gpu_hours"], rel=1e-6)
    user = cluster.job(whole)["user"]
    assert rows[("user", "default", f"alpha/{user}")]["gpu_hours"] == pytest.approx(alpha["gpu_hours"], rel=1e-6)

    def metrics() -> str:
        with urllib.request.urlopen(f"{cluster.url}/metrics", timeout=5) as answer:
            return answer.read().decode()

    def alpha_metric() -> float | None:
        return next((float(line.split()[-1]) for line in metrics().splitlines()
                     if line.startswith("gpud_usage_gpu_seconds{") and 'name="alpha"' in line), None)
    # The metric is as of the last charge: the first charge after the jobs' end brings it level with the API.
    wait_for(lambda: alpha_metric() == pytest.approx(alpha["gpu_hours"] * 3600, abs=0.01),
             "the metric to show alpha's charged usage")
    assert "gpud_usage_charges_total" in metrics()
    # alpha used ~2.7x beta with equal quotas: alpha's standing is below 1, beta's above.
    assert alpha["standing"] < 1 < beta["standing"]


def test_usage_survives_a_controller_kill_9_without_loss_or_double_charge(cluster):
    cluster.start_node("n1", gpus=2)
    release = cluster.workdir / "go"
    job = cluster.submit(command=["sh", "-c", f"while [ ! -e {release} ]; do sleep 0.05; done"], gpus=2)
    started = cluster.wait_state(job, "RUNNING")["started"]
    time.sleep(3 * INTERVAL_S + 1.0)
    read_at = time.time()
    before = gpu_seconds(cluster, "project", "alpha")
    assert before > 2.0
    cluster.controller.stop(signal.SIGKILL)
    db = sqlite3.connect(cluster.state_dir / "gpud.sqlite")
    stored = db.execute("SELECT gpu_s FROM usage WHERE level = 'project' AND name = 'alpha'").fetchone()[0]
    (stored_as_of,) = db.execute("SELECT as_of FROM usage_clock WHERE id = 0").fetchone()
    db.close()
    # The store held, at the kill, every GPU-second of the job up to its last charge, and that charge was
    # recent: charged while running, every interval, however a busy host stretches the intervals a little.
    assert stored == pytest.approx(2 * (stored_as_of - started), abs=0.05), (stored, stored_as_of, started)
    assert stored_as_of > read_at - 2.0, f"the last stored charge was {read_at - stored_as_of:.2f} s old"
    time.sleep(1.0)
    cluster.start_controller()
    wait_for(lambda: cluster.node_state("n1") == "up", "the node to come back")
    after = gpu_seconds(cluster, "project", "alpha")
    assert after >= before     # the job ran on while the controller was away: that time is charged too
    release.touch()
    cluster.wait_state(job, "COMPLETED")
    time.sleep(2 * INTERVAL_S)
    total = gpu_seconds(cluster, "project", "alpha")
    # Neither lost nor charged twice: exactly the GPU-seconds the job held, from placement to exit.
    assert total == pytest.approx(job_gpu_seconds(cluster, job), abs=0.1)


def test_users_see_projects_and_their_own_usage_only(cluster):
    cluster.start_node("n1", gpus=2)
    # Accounts every host has, so the jobs really run as them.
    alice, bob = cluster.token_for("nobody"), cluster.token_for("daemon")
    for token in (alice, bob):
        job = cluster.submit(token=token, command=["sleep", "1"], gpus=1, workdir="/tmp", output="/dev/null")
        cluster.wait_state(job, "COMPLETED")
    time.sleep(2 * INTERVAL_S)
    seen = usage(cluster, token=alice)
    users = {key[2] for key in seen if key[0] == "user"}
    assert users == {"alpha/nobody"}
    assert ("project", "default", "alpha") in seen and ("department", "default", "research") in seen
    assert {key[2] for key in usage(cluster) if key[0] == "user"} >= {"alpha/nobody", "alpha/daemon"}
    mine = usage(cluster, token=alice, user="nobody")
    assert sorted(key[::2] for key in mine) == [("department", "research"), ("project", "alpha"),
                                                ("user", "alpha/nobody")]
    status, body = cluster.api("GET", "/api/v1/usage?user=daemon", token=alice)
    assert status == 403 and "admins" in body["error"]
    status, body = cluster.api("GET", "/api/v1/report?by=user", token=alice)
    assert status == 200 and [row["user"] for row in body["rows"]] == ["nobody"]
    status, body = cluster.api("GET", "/api/v1/report?by=user")
    assert {row["user"] for row in body["rows"]} == {"nobody", "daemon"}
