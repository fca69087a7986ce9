"""Run times and end times as a real controller records them across preemption and its own restart."""

from __future__ import annotations

import signal
import time

import pytest

from daemons import LiveCluster, wait_for


@pytest.fixture
def cluster(tmp_path):
    live = LiveCluster(tmp_path)
    live.start_controller()
    yield live
    live.close()


def test_a_requeued_job_runs_nowhere_its_time_stops_and_history_keeps_its_run(cluster):
    cluster.start_node("n1", gpus=4)
    hogs = [cluster.submit(command=["sleep", "300"], gpus=1, cpus=0.25, project="alpha") for _ in range(4)]
    for job_id in hogs:
        cluster.wait_state(job_id, "RUNNING")
    time.sleep(2)
    newcomer = cluster.submit(command=["sleep", "300"], gpus=2, cpus=0.25, project="beta")
    cluster.wait_state(newcomer, "RUNNING")
    requeued = [cluster.job(j) for j in hogs if cluster.job(j)["restart_count"] == 1]
    assert len(requeued) == 2
    job = requeued[0]
    assert job["state"] == "PENDING" and job["nodes"] == [] and job["placements"] == [None]
    ran = job["elapsed_s"]
    assert 2 <= ran < 30
    time.sleep(1.5)
    assert cluster.job(job["id"])["elapsed_s"] == ran      # waiting again is not running
    assert cluster.api("POST", f"/api/v1/jobs/{job['id']}/cancel")[0] == 200
    history = {j["id"]: j for j in cluster.api("GET", "/api/v1/history")[1]["jobs"]}
    ended = history[job["id"]]
    assert ended["state"] == "CANCELLED" and ended["elapsed_s"] == ran and ended["nodes"] == ["n1"]
    cluster.api("POST", f"/api/v1/jobs/{newcomer}/cancel")
    running = cluster.wait_state(requeued[1]["id"], "RUNNING")
    assert running["elapsed_s"] >= ran - 1 and running["nodes"] == ["n1"]


def test_an_exit_heard_after_a_controller_restart_keeps_the_nodes_end_time(cluster):
    cluster.start_node("n1", gpus=2)
    release, begun = cluster.workdir / "go", cluster.workdir / "begun"
    job_id = cluster.submit(command=["sh", "-c", f"touch {begun}; while [ ! -e {release} ]; do sleep 0.05; done"],
                            gpus=1)
    cluster.wait_state(job_id, "RUNNING")
    # RUNNING is the controller's word once it has sent the start; on a busy host the process comes later.
    wait_for(begun.exists, "the task's process to start")
    cluster.controller.stop(signal.SIGKILL)
    release.touch()                     # the task ends while no controller is there to hear it
    exited_about = time.time()
    time.sleep(3)
    restarted = time.time()
    cluster.start_controller()
    job = cluster.wait_state(job_id, "COMPLETED")
    assert exited_about - 1 < job["ended"] < exited_about + 1.5 < restarted, (exited_about, restarted, job)
    assert job["elapsed_s"] == pytest.approx(job["ended"] - job["started"], abs=0.01)
    wait_for(lambda: cluster.api("GET", "/api/v1/history")[1]["jobs"], "the job in the history")
