"""Run times and end times as a real controller records them across preemption and its own restart."""

from __future__ import annotations

import signal
import sys
import time
from pathlib import Path

import pytest

from daemons import wait_for
from gpud.node.taskstate import EXITED, Layout, read_state
from programs import until_exists


@pytest.fixture
def cluster(live_cluster):
    return live_cluster()


def test_a_requeued_job_runs_nowhere_its_time_stops_and_history_keeps_its_run(cluster):
    cluster.start_node("n1", gpus=4)
    hogs = [cluster.submit(command=["sleep", "300"], gpus=1, cpus=0.25, project="alpha") for _ in range(4)]
    for job_id in hogs:
        cluster.wait_state(job_id, "RUNNING")
    wait_for(lambda: all(cluster.job(job_id)["elapsed_s"] >= 2 for job_id in hogs), "the hogs to have run 2 s")
    newcomer = cluster.submit(command=["sleep", "300"], gpus=2, cpus=0.25, project="beta")
    cluster.wait_state(newcomer, "RUNNING")
    requeued = [cluster.job(j) for j in hogs if cluster.job(j)["restart_count"] == 1]
    assert len(requeued) == 2
    job = requeued[0]
    assert job["state"] == "PENDING" and job["nodes"] == [] and job["placements"] == [None]
    ran = job["elapsed_s"]
    assert 2 <= ran < 30
    cluster.wait_cycles(2)
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
    release, begun, last_act = cluster.workdir / "go", cluster.workdir / "begun", cluster.workdir / "last-act"
    script = (f"import os, time\nopen({str(begun)!r}, 'w').close()\n"
              + until_exists(str(release)) +
              f"open({str(last_act)!r}, 'w').write(repr(time.time()))\n")
    job_id = cluster.submit(command=[sys.executable, "-c", script], gpus=1)
    cluster.wait_state(job_id, "RUNNING")
    # RUNNING is the controller's word once it has sent the start; on a busy host the process comes later.
    wait_for(begun.exists, "the task's process to start")
    cluster.controller.stop(signal.SIGKILL)
    release.touch()                     # the task ends while no controller is there to hear it
    tasks = Path(Layout(str(cluster.root / "n1")).tasks_dir)
    wait_for(lambda: [getattr(read_state(str(d)), "state", None) for d in tasks.glob(f"{job_id}.0.0*")] == [EXITED],
             "the node to record the task's end")
    recorded_by = time.time()
    time.sleep(1)                       # an end stamped when the restarted controller hears it would be later still
    restarted = time.time()
    cluster.start_controller()
    job = cluster.wait_state(job_id, "COMPLETED")
    # The task's last act comes before its end, and the node had recorded that end before the controller was back;
    # bounds from what the task and the node did, not from how fast a loaded host let them do it.
    task_done = float(last_act.read_text())
    assert task_done - 0.01 <= job["ended"] <= recorded_by + 0.01 < restarted, (task_done, recorded_by, restarted, job)
    assert job["elapsed_s"] == pytest.approx(job["ended"] - job["started"], abs=0.01)
    wait_for(lambda: cluster.api("GET", "/api/v1/history")[1]["jobs"], "the job in the history")
