"""Preemption that loses the least work, live: a controller and a node daemon with 2 fake GPUs.

Train job X checkpoints every 2 s (``gpuctl checkpointed`` with its own credential); younger train
job Y never does. A preemptible job of a higher class needs one GPU: X is the victim (it would lose
less), hears its ``--signal`` before the stop, reports a last checkpoint and is stopped at once; it
restarts from its checkpoint directory with GPUD_RESTART_COUNT=1. Y keeps running.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import pytest

from daemons import LiveCluster, running_cluster, wait_for

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="the node runs jobs as their users only as root")

POLICY = """\
grace_period = 2
min_runtime = 3

[[projects]]
name = "alpha"
gpu_quota = 2
"""

GPUCTL = str(Path(sys.executable).parent / "gpuctl")

# Checkpoints every 2 s; on USR1 saves a last one and reports it. ``sleep & wait`` lets the trap run at once.
TRAINER = f"""\
log="$WORK/x.log"
echo "run restart=$GPUD_RESTART_COUNT slurm=$SLURM_RESTART_COUNT last=$GPUD_LAST_CHECKPOINT" >> "$log"
echo "files $(ls "$GPUD_CHECKPOINT_DIR" | tr '\\n' ' ')" >> "$log"
trap 'echo "heard USR1" >> "$log"; echo final > "$GPUD_CHECKPOINT_DIR/final.ckpt"; {GPUCTL} checkpointed >> "$log" 2>&1' USR1
while true; do
  echo step > "$GPUD_CHECKPOINT_DIR/step.ckpt"
  {GPUCTL} checkpointed >> "$log" 2>&1
  sleep 2 & wait $!
done
"""


@pytest.fixture
def cluster():
    root = Path(tempfile.mkdtemp(prefix="gpud-lostwork-"))
    try:
        with running_cluster(root, POLICY, nodes={"n1": 2}) as live:
            yield live
    finally:
        shutil.rmtree(root, ignore_errors=True)


def events(cluster: LiveCluster, job_id: str) -> list[str]:
    return [e["kind"] for e in cluster.job(job_id)["events"]]


def test_the_job_that_checkpointed_is_told_stopped_and_restarts_from_its_checkpoint(cluster):
    log = cluster.workdir / "x.log"
    x = cluster.submit(script="#!/bin/bash\n" + TRAINER, env={"WORK": str(cluster.workdir)}, gpus=1,
                       cpus=0.1, memory_gib=0.1, warn_signal="USR1", warn_lead_s=5)
    cluster.wait_state(x, "RUNNING")
    wait_for(lambda: cluster.job(x)["checkpoints"], "X to record a checkpoint", timeout=60)
    y = cluster.submit(command=["sleep", "600"], gpus=1, cpus=0.1, memory_gib=0.1)
    cluster.wait_state(y, "RUNNING")
    # Both past min_runtime, and Y long enough that it would lose more than X's 2 s between checkpoints.
    wait_for(lambda: cluster.job(y)["elapsed_s"] > 8, "Y to run 8 s", timeout=60)
    assert cluster.job(x)["elapsed_s"] > 8

    z = cluster.submit(command=["sleep", "3"], gpus=1, cpus=0.1, memory_gib=0.1,
                       priority="interactive-preemptible")
    shown = wait_for(lambda: (j := cluster.job(x))["restart_count"] >= 1 and j, "X to be preempted", timeout=60)
    assert shown["state"] in ("PENDING", "RUNNING")
    wait_for(lambda: "heard USR1" in log.read_text(), "X to hear its signal", timeout=30)
    kinds = wait_for(lambda: "stopped" in (k := events(cluster, x)) and k,
                     "X to be stopped after its last checkpoint", timeout=30)
    last_checkpoint = len(kinds) - 1 - kinds[::-1].index("checkpointed")
    assert max(kinds.index("preempted"), kinds.index("signalled")) < last_checkpoint < kinds.index("stopped")
    assert cluster.job(y)["state"] == "RUNNING" and cluster.job(y)["restart_count"] == 0

    cluster.wait_state(z, "COMPLETED", timeout=60)

    def restarted() -> list[str] | None:
        lines = log.read_text().splitlines()
        rerun = next((i for i, line in enumerate(lines) if line.startswith("run restart=1")), None)
        return lines if rerun is not None and len(lines) > rerun + 1 else None
    lines = wait_for(restarted, "X to restart and list its checkpoint directory", timeout=60)
    rerun = next(i for i, line in enumerate(lines) if line.startswith("run restart=1"))
    assert "slurm=1" in lines[rerun]
    last = float(lines[rerun].split("last=")[1])
    assert time.time() - 120 < last < time.time()
    assert lines[rerun + 1].split()[1:] == ["final.ckpt", "step.ckpt"]
    assert lines.index("heard USR1") < rerun
    job = cluster.job(x)
    assert job["lost_gpu_hours"] == 0, "X checkpointed within its grace: it lost nothing"
    assert job["last_checkpoint"] == pytest.approx(max(c["at"] for c in job["checkpoints"]))
    assert any(c["restart"] == 0 for c in job["checkpoints"])
    # The last checkpoint of the run that was stopped (within its grace, after the requeue) is that run's.
    before_restart = [c for c in job["checkpoints"] if c["at"] <= last]
    assert before_restart and all(c["restart"] == 0 for c in before_restart)
    y_job = cluster.job(y)
    assert y_job["state"] == "RUNNING" and y_job["restart_count"] == 0


def test_a_checkpoint_credential_opens_nothing_else(cluster):
    x = cluster.submit(script="#!/bin/bash\necho \"$GPUD_CHECKPOINT_TOKEN\" > \"$WORK/token\"; exec sleep 600\n",
                       env={"WORK": str(cluster.workdir)}, gpus=1, cpus=0.1, memory_gib=0.1)
    other = cluster.submit(command=["sleep", "600"], gpus=1, cpus=0.1, memory_gib=0.1)
    cluster.wait_state(x, "RUNNING")
    cluster.wait_state(other, "RUNNING")
    token_file = cluster.workdir / "token"
    token = wait_for(lambda: token_file.exists() and token_file.read_text().strip(), "the task to write its token")
    assert token.startswith("gpudckpt_")
    assert cluster.api("GET", f"/api/v1/jobs/{x}", token=token)[0] == 401
    assert cluster.api("POST", f"/api/v1/jobs/{x}/cancel", token=token)[0] == 401
    assert cluster.api("POST", f"/api/v1/jobs/{other}/checkpoints", token=token)[0] == 401
    status, body = cluster.api("POST", f"/api/v1/jobs/{x}/checkpoints", token=token)
    assert status == 201 and body["checkpoints"] == 1, body
    assert "checkpointed" in events(cluster, x)
    assert cluster.job(x)["state"] == "RUNNING"


def test_a_marker_file_in_the_checkpoint_directory_records_a_checkpoint(cluster):
    # A program that cannot run a command touches the marker; the node notices each new one.
    script = ("#!/bin/bash\nsleep 1; touch \"$GPUD_CHECKPOINT_DIR/.gpud-checkpointed\"\n"
              "sleep 2; touch \"$GPUD_CHECKPOINT_DIR/.gpud-checkpointed\"\nexec sleep 600\n")
    x = cluster.submit(script=script, gpus=1, cpus=0.1, memory_gib=0.1)
    cluster.wait_state(x, "RUNNING")
    job = wait_for(lambda: len((j := cluster.job(x))["checkpoints"]) >= 2 and j, "two marked checkpoints",
                   timeout=60)
    assert [c["source"] for c in job["checkpoints"]] == ["file", "file"]
    first, second = (c["at"] for c in job["checkpoints"])
    assert 1.0 < second - first < 10.0 and job["last_checkpoint"] == second
    assert events(cluster, x).count("checkpointed") == len(cluster.job(x)["checkpoints"])


def test_the_signal_comes_lead_seconds_before_the_time_limit(cluster):
    log = cluster.workdir / "limit.log"
    script = (f"#!/bin/bash\ntrap 'echo \"heard $(date +%s.%N)\" >> {log}' USR1\n"
              f"echo \"began $(date +%s.%N)\" >> {log}\nwhile true; do sleep 0.2 & wait $!; done\n")
    x = cluster.submit(script=script, gpus=1, cpus=0.1, memory_gib=0.1, time_limit_s=8, warn_signal="USR1",
                       warn_lead_s=5)
    job = cluster.wait_state(x, "TIMEOUT", timeout=60)
    times = dict(line.split() for line in log.read_text().splitlines())
    # From the job's start, not from when bash got to write "began", which a busy host can delay by seconds.
    # Due 3 s in (limit 8 s, lead 5 s): never early (the start is taken as the time limit begins, less a
    # little), and well before the limit itself, where a signal that ignored the lead would come.
    heard_after = float(times["heard"]) - job["started"]
    assert float(times["began"]) < float(times["heard"])
    assert 2.5 < heard_after < 7.0, f"USR1 came {heard_after:.1f} s after the start (limit 8 s, lead 5 s)"
    assert job["signal"] == {"signal": "USR1", "lead_s": 5.0, "batch_only": False}


def test_work_lost_at_a_stop_is_counted_by_project(cluster):
    w = cluster.submit(command=["sleep", "600"], gpus=2, cpus=0.1, memory_gib=0.1)
    cluster.wait_state(w, "RUNNING")
    wait_for(lambda: cluster.job(w)["elapsed_s"] > 4, "W to run past min_runtime", timeout=60)
    cluster.submit(command=["sleep", "600"], gpus=1, cpus=0.1, memory_gib=0.1, priority="interactive-preemptible")
    job = wait_for(lambda: (j := cluster.job(w))["restart_count"] >= 1 and j, "W to be preempted", timeout=60)
    lost_s = job["lost_gpu_hours"] * 3600
    assert 2 * 4 <= lost_s <= 2 * (job["elapsed_s"] + 5), "2 GPUs since its start: it never checkpointed"

    def metric() -> float | None:
        with urllib.request.urlopen(f"{cluster.url}/metrics", timeout=10) as answer:
            text = answer.read().decode()
        line = next((row for row in text.splitlines()
                     if row.startswith('gpud_preemption_lost_gpu_seconds_total{project="alpha"}')), None)
        return float(line.split()[-1]) if line else None
    assert metric() == pytest.approx(lost_s, abs=1.0)
    status, report = cluster.api("GET", "/api/v1/report?by=project")
    assert status == 200, report
    alpha = next(row for row in report["rows"] if row["project"] == "alpha")
    assert alpha["lost_gpu_hours"] * 3600 == pytest.approx(lost_s, abs=1.0)
    assert alpha["gpu_hours"] > 0


def test_a_victim_that_does_not_requeue_checkpoints_within_its_grace_and_loses_nothing(cluster):
    # Ended PREEMPTED at the eviction, its tasks still run out their grace: a checkpoint then still counts.
    log = cluster.workdir / "x.log"
    x = cluster.submit(script="#!/bin/bash\n" + TRAINER, env={"WORK": str(cluster.workdir)}, gpus=2,
                       cpus=0.1, memory_gib=0.1, warn_signal="USR1", warn_lead_s=30, requeue=False)
    cluster.wait_state(x, "RUNNING")
    wait_for(lambda: cluster.job(x)["checkpoints"], "X to record a checkpoint", timeout=60)
    wait_for(lambda: cluster.job(x)["elapsed_s"] > 4, "X to run past min_runtime", timeout=60)
    cluster.submit(command=["sleep", "600"], gpus=1, cpus=0.1, memory_gib=0.1, priority="interactive-preemptible")

    job = cluster.wait_state(x, "PREEMPTED", timeout=60)
    wait_for(lambda: "heard USR1" in log.read_text(), "X to hear its signal", timeout=30)
    kinds = wait_for(lambda: "stopped" in (k := events(cluster, x)) and k,
                     "X to be stopped at once after its last checkpoint", timeout=25)
    last_checkpoint = len(kinds) - 1 - kinds[::-1].index("checkpointed")
    assert kinds.index("signalled") < last_checkpoint < kinds.index("stopped")
    job = cluster.job(x)
    assert job["state"] == "PREEMPTED" and job["lost_gpu_hours"] == 0, job
    assert job["last_checkpoint"] > job["ended"] - 1
    log_text = log.read_text()
    assert "409" not in log_text and "refused" not in log_text, log_text


def test_a_victim_that_does_not_requeue_and_never_checkpoints_is_charged_on_its_record(cluster):
    w = cluster.submit(command=["sleep", "600"], gpus=2, cpus=0.1, memory_gib=0.1, warn_signal="USR1",
                       warn_lead_s=1, requeue=False)
    cluster.wait_state(w, "RUNNING")
    wait_for(lambda: cluster.job(w)["elapsed_s"] > 4, "W to run past min_runtime", timeout=60)
    cluster.submit(command=["sleep", "600"], gpus=1, cpus=0.1, memory_gib=0.1, priority="interactive-preemptible")
    job = cluster.wait_state(w, "PREEMPTED", timeout=60)
    # Its loss is settled when the grace (the policy's 2 s) ends without a checkpoint: 2 GPUs since its start.
    job = wait_for(lambda: (j := cluster.job(w))["lost_gpu_hours"] > 0 and j, "W's loss to be charged", timeout=30)
    assert 2 * 4 <= job["lost_gpu_hours"] * 3600 <= 2 * (job["elapsed_s"] + 5)
    status, body = cluster.api("POST", f"/api/v1/jobs/{w}/checkpoints")
    assert status == 409 and "PREEMPTED" in body["error"], body
