"""A job's life through a real controller and real node daemons: run, fail, cancel, time out, survive crashes."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from daemons import LiveCluster, wait_for
from node_helpers import alive, kill_everything
from programs import FOREVER

PY_ENV = ("import os; print(' '.join(f'{k}={os.environ.get(k)}' for k in ('CUDA_VISIBLE_DEVICES', "
          "'GPUD_JOB_ID', 'GPUD_TASK_INDEX', 'GPUD_NUM_TASKS', 'GPUD_RESTART_COUNT', 'MASTER_ADDR', "
          "'MASTER_PORT', 'WORLD_SIZE', 'RANK', 'LOCAL_RANK')))")


@pytest.fixture
def cluster(live_cluster):
    return live_cluster()


def output_of(cluster: LiveCluster, job_id: str) -> str:
    path = cluster.workdir / f"gpud-{job_id}.out"
    return path.read_text() if path.exists() else ""


def test_a_job_runs_on_its_gpus_and_completes_with_its_exit_code(cluster):
    cluster.start_node("n1", gpus=4)
    job_id = cluster.submit(command=["python3", "-c", PY_ENV], gpus=2)
    job = cluster.wait_state(job_id, "COMPLETED")
    assert job["exit_code"] == 0
    assert job["nodes"] == ["n1"]
    env = dict(item.split("=", 1) for item in output_of(cluster, job_id).split())
    uuids = env["CUDA_VISIBLE_DEVICES"].split(",")
    assert len(uuids) == 2 and all(u.startswith("GPU-") for u in uuids)
    assert env["GPUD_JOB_ID"] == job_id and env["GPUD_NUM_TASKS"] == "1" and env["GPUD_RESTART_COUNT"] == "0"
    status, history = cluster.api("GET", "/api/v1/history")
    assert [j["id"] for j in history["jobs"]] == [job_id]
    events = cluster.job(job_id)["events"]
    assert [e["kind"] for e in events][:2] == ["submitted", "started"]
    assert events[0]["message"].startswith("submitted by ") and events[0]["message"].endswith(" to project alpha")


def test_a_failing_task_fails_the_job_with_its_code(cluster):
    cluster.start_node("n1", gpus=1)
    job_id = cluster.submit(command=["sh", "-c", "exit 3"], gpus=1)
    job = cluster.wait_state(job_id, "FAILED")
    assert job["exit_code"] == 3
    assert "code 3" in job["reason"]


def test_cancel_sends_term_then_kill_after_the_grace_period(cluster):
    cluster.start_node("n1", gpus=1)
    pid_file = cluster.workdir / "pid"
    script = f"trap '' TERM; echo $$ > {pid_file}; while true; do sleep 0.1; done"
    job_id = cluster.submit(command=["sh", "-c", script], gpus=1)
    cluster.wait_state(job_id, "RUNNING")
    pid = int(wait_for(lambda: pid_file.exists() and pid_file.read_text().strip(), "the task to start"))
    cancelled = time.monotonic()
    status, body = cluster.api("POST", f"/api/v1/jobs/{job_id}/cancel")
    assert status == 200 and body["ids"] == [job_id]
    assert cluster.job(job_id)["state"] == "CANCELLED"
    wait_for(lambda: not alive(pid), "SIGKILL after the grace period", timeout=15)
    # Seen dead no sooner than the grace after the cancel was asked for: a bound no slow host can break, where
    # a check that it still lived 1 s after the cancel's answer failed when the answer itself came late.
    assert time.monotonic() - cancelled >= 2.0, "the task ignores SIGTERM, so it lives until the grace period ends"
    # The GPU came back: a new job runs on it.
    cluster.wait_state(cluster.submit(command=["true"], gpus=1), "COMPLETED")


def test_a_job_past_its_time_limit_ends_timeout(cluster):
    cluster.start_node("n1", gpus=1)
    job_id = cluster.submit(command=["sleep", "60"], gpus=1, time_limit_s=1)
    job = cluster.wait_state(job_id, "TIMEOUT")
    assert job["ended"] - job["started"] < 10


def test_a_gang_on_two_nodes_gets_the_rendezvous_variables(cluster):
    cluster.start_node("n1", gpus=2)
    cluster.start_node("n2", gpus=2)
    job_id = cluster.submit(command=["python3", "-c", PY_ENV], gpus=2, tasks=2, output="gang-%t.out")
    job = cluster.wait_state(job_id, "COMPLETED")
    assert sorted(job["nodes"]) == ["n1", "n2"]
    envs = [dict(i.split("=", 1) for i in (cluster.workdir / f"gang-{t}.out").read_text().split())
            for t in (0, 1)]
    assert [e["RANK"] for e in envs] == ["0", "1"]
    assert {e["WORLD_SIZE"] for e in envs} == {"2"} and {e["LOCAL_RANK"] for e in envs} == {"0"}
    assert envs[0]["MASTER_ADDR"] == envs[1]["MASTER_ADDR"] and envs[0]["MASTER_PORT"] == envs[1]["MASTER_PORT"]


def test_an_accepted_submit_survives_kill_9_of_the_controller(cluster):
    ids = [cluster.submit(command=["true"], gpus=1) for _ in range(20)]
    cluster.controller.stop(signal.SIGKILL)
    cluster.start_controller()
    status, body = cluster.api("GET", "/api/v1/jobs")
    assert [j["id"] for j in body["jobs"]] == ids
    assert cluster.submit(command=["true"]) == str(int(ids[-1]) + 1), "ids are never reused"
    cluster.start_node("n1", gpus=4)
    for job_id in ids:
        cluster.wait_state(job_id, "COMPLETED")


def test_ids_go_on_after_the_newest_job_even_when_it_has_finished(cluster):
    ids = [cluster.submit(command=["true"], gpus=1) for _ in range(3)]
    for job_id in ids:
        assert cluster.api("POST", f"/api/v1/jobs/{job_id}/cancel")[0] == 200
    cluster.controller.stop(signal.SIGKILL)
    cluster.start_controller()
    assert cluster.submit(command=["true"]) == str(int(ids[-1]) + 1)


def test_a_running_job_survives_a_controller_crash_and_its_exit_is_recorded(cluster):
    cluster.start_node("n1", gpus=2)
    release = cluster.workdir / "go"
    job_id = cluster.submit(command=["sh", "-c", f"while [ ! -e {release} ]; do sleep 0.05; done; exit 7"],
                            gpus=1)
    cluster.wait_state(job_id, "RUNNING")
    cluster.controller.stop(signal.SIGKILL)
    release.touch()                     # the task ends while no controller is there to hear it
    time.sleep(0.5)
    cluster.start_controller()
    job = cluster.wait_state(job_id, "FAILED")
    assert job["exit_code"] == 7


def test_a_task_the_controller_no_longer_wants_is_stopped_after_a_restart(cluster):
    cluster.start_node("n1", gpus=1)
    job_id = cluster.submit(command=["sleep", "300"], gpus=1)
    cluster.wait_state(job_id, "RUNNING")
    cluster.controller.stop(signal.SIGKILL)
    # A controller that lost its state (a fresh state directory) refuses to start as a new cluster...
    import shutil
    shutil.copy(cluster.state_dir / "cluster.key", cluster.root / "key")
    shutil.rmtree(cluster.state_dir)
    cluster.state_dir.mkdir()
    shutil.copy(cluster.root / "key", cluster.state_dir / "cluster.key")
    refused = subprocess.run([sys.executable, "-m", "gpud.cli.gpud_main", "controller", "--config",
                              str(cluster.config)], capture_output=True, text=True, timeout=60)
    assert refused.returncode == 1 and "does not exist" in refused.stderr and "gpud backup" in refused.stderr
    # ... and made anew with --init it is another cluster, whose orders the node does not take.
    cluster.start_controller()
    node_dir = cluster.root / "n1" / "tasks"
    wait_for(lambda: "belongs to cluster" in cluster.nodes["n1"].output(), "the node to refuse the new cluster")
    assert cluster.node_state("n1") is None
    # (The task may already be stopped: with no controller of its own the node's lease runs out.)
    # Once the node is told to join it, the new cluster stops the task it does not know.
    cluster.nodes["n1"].stop()
    os.unlink(cluster.root / "n1" / "cluster.id")
    cluster.start_node("n1", gpus=1)
    wait_for(lambda: not any(_task_running(node_dir / d) for d in os.listdir(node_dir)),
             "the unwanted task to be stopped")


def _task_running(task_dir) -> bool:
    import json
    state_file = task_dir / "state.json"
    if not state_file.exists():
        return True
    state = json.loads(state_file.read_text())
    return state.get("state") != "exited"


def test_a_silent_node_is_marked_down_and_its_jobs_requeued_or_failed(tmp_path):
    cluster = LiveCluster(tmp_path, node_timeout_s=2.0, heartbeat_s=0.3)
    try:
        cluster.start_controller()
        node = cluster.start_node("n1", gpus=4)
        cluster.start_node("n2", gpus=4)
        train = cluster.submit(command=["sleep", "300"], gpus=4, constraint={"pool": "default"})
        cluster.wait_state(train, "RUNNING")
        on_n1 = cluster.job(train)["nodes"] == ["n1"]
        victim = "n1" if on_n1 else "n2"
        build = cluster.submit(command=["sleep", "300"], gpus=2, priority="build")
        cluster.wait_state(build, "RUNNING")
        build_on_victim = cluster.job(build)["nodes"] == [victim]
        cluster.nodes[victim].stop(signal.SIGKILL)
        kill_everything(str(tmp_path / victim))
        wait_for(lambda: cluster.node_state(victim) == "down", "the silent node to be marked down")
        job = cluster.job(train)
        assert job["state"] == "PENDING" and job["restart_count"] == 1
        assert job["nodes"] == [], "a job requeued off a lost node runs nowhere while it waits"
        assert any(e["kind"] == "node failure" and f"node {victim} is down" in e["message"] for e in job["events"])
        if build_on_victim:
            assert cluster.job(build)["state"] == "NODE_FAIL"
        # The requeued job runs again on the surviving node once it has room.
        cluster.api("POST", f"/api/v1/jobs/{build}/cancel")
        assert cluster.wait_state(train, "RUNNING")["nodes"] == ["n2" if victim == "n1" else "n1"]
        del node
    finally:
        cluster.close()


def test_reclaim_preempts_and_requeues_with_a_restart_count(cluster):
    cluster.start_node("n1", gpus=4)
    hogs = [cluster.submit(command=["python3", "-u", "-c", PY_ENV + "\n" + FOREVER], gpus=1,
                           cpus=0.25, project="alpha") for _ in range(4)]
    for job_id in hogs:
        cluster.wait_state(job_id, "RUNNING")
    newcomer = cluster.submit(command=["sleep", "300"], gpus=2, cpus=0.25, project="beta")
    cluster.wait_state(newcomer, "RUNNING")
    requeued = [j for j in hogs if cluster.job(j)["restart_count"] == 1]
    assert len(requeued) == 2
    for job_id in requeued:
        job = cluster.job(job_id)
        # Why it was stopped stays in its events; its reason says what it waits for now (its old copy's end,
        # then GPUs).
        assert job["state"] == "PENDING"
        assert any(e["kind"] == "preempted" and "(reclaim)" in e["message"] for e in job["events"]), job["events"]
    # When the newcomer ends, the evicted jobs start again and see their restart count.
    cluster.api("POST", f"/api/v1/jobs/{newcomer}/cancel")
    for job_id in requeued:
        cluster.wait_state(job_id, "RUNNING")
        wait_for(lambda: "GPUD_RESTART_COUNT=1" in output_of(cluster, job_id), "the restarted task's output")


def test_a_faulty_gpu_is_taken_out_of_service_and_reported(cluster):
    from gpud.gpu.fake import inject_fault

    cluster.start_node("n1", gpus=2)
    inject_fault(str(cluster.root / "n1"), 1, "ecc_uncorrectable")

    def gpu_one_unhealthy():
        status, body = cluster.api("GET", "/api/v1/nodes")
        return not body["nodes"][0]["gpus"][1]["healthy"]
    wait_for(gpu_one_unhealthy, "the fault to reach the controller")
    first = cluster.submit(command=["sleep", "300"], gpus=1, cpus=0.5)
    second = cluster.submit(command=["sleep", "300"], gpus=1, cpus=0.5)
    assert cluster.wait_state(first, "RUNNING")["placements"][0]["gpus"] == [0]
    cluster.wait_cycles(2)
    assert cluster.job(second)["state"] == "PENDING"
    status, metrics = cluster.api("GET", "/metrics", token=None)
    assert 'gpud_gpus_unhealthy{pool="default"} 1' in metrics


def test_a_job_keeps_running_through_a_kill_9_of_its_node_daemon(cluster):
    cluster.start_node("n1", gpus=1)
    release = cluster.workdir / "go"
    job_id = cluster.submit(command=["sh", "-c", f"while [ ! -e {release} ]; do sleep 0.05; done; exit 4"],
                            gpus=1)
    wait_for(lambda: (cluster.job(job_id)["placements"][0] or {}).get("state") == "running",
             "the node to report the task running")
    cluster.nodes["n1"].stop(signal.SIGKILL)
    time.sleep(0.5)
    assert cluster.job(job_id)["state"] == "RUNNING"
    cluster.start_node("n1", gpus=1)          # the restarted daemon adopts the task
    release.touch()
    job = cluster.wait_state(job_id, "FAILED")
    assert job["exit_code"] == 4 and job["restart_count"] == 0
