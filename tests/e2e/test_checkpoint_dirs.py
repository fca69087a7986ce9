"""Checkpoint directories are the job's own: named by a job uid, private to its user, gone when it ends.

A real controller and node daemon on 127.0.0.1; jobs run as real users (root needed to switch to them).
"""

from __future__ import annotations

import os
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from daemons import running_cluster, wait_for

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="jobs run as other users only under a root node")

# Writes a checkpoint, says where, then waits to be stopped.
WRITE_AND_WAIT = 'echo "$GPUD_CHECKPOINT_DIR"; echo weights > "$GPUD_CHECKPOINT_DIR/model.ckpt"; exec sleep 300'
# Says where its checkpoint directory is and what it holds.
LIST = 'echo "$GPUD_CHECKPOINT_DIR"; ls -A "$GPUD_CHECKPOINT_DIR"; echo end'


@pytest.fixture
def shared_workdir():
    """A workdir every user may write its output to (pytest's own temporary directories are root's alone)."""
    path = tempfile.mkdtemp(prefix="gpud-ckpt-")
    os.chmod(path, 0o777)
    yield Path(path)
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def cluster():
    # The node's state directory must be reachable by the jobs' users, as /var/lib/gpud/node is.
    root = tempfile.mkdtemp(prefix="gpud-ckpt-root-")
    os.chmod(root, 0o711)
    try:
        with running_cluster(Path(root), nodes={"n1": 2}) as live:
            yield live
    finally:
        shutil.rmtree(root, ignore_errors=True)


def output_lines(workdir: Path, job_id: str, last: str | None = None) -> list[str]:
    """The job's output lines once it has written them (up to ``last`` when given)."""
    def written():
        try:
            lines = (workdir / f"gpud-{job_id}.out").read_text().splitlines()
        except FileNotFoundError:
            return None
        return lines if lines and (last is None or last in lines) else None
    return wait_for(written, f"job {job_id} to write its output")


def can_read_as(uid: int, path: str) -> bool:
    """Whether a process of user ``uid`` (not root) can list the directory ``path``."""
    probe = subprocess.run(["/bin/ls", path], user=uid, group=uid, extra_groups=[], capture_output=True,
                           cwd="/", timeout=30)
    return probe.returncode == 0


def test_a_checkpoint_dir_is_its_users_alone_and_goes_with_the_job(cluster, shared_workdir):
    nobody = cluster.token_for("nobody")
    job_id = cluster.submit(token=nobody, command=["/bin/sh", "-c", WRITE_AND_WAIT], cpus=0.1, memory_gib=0.1,
                            workdir=str(shared_workdir))
    cluster.wait_state(job_id, "RUNNING")
    directory = output_lines(shared_workdir, job_id)[0]
    wait_for(lambda: os.path.exists(os.path.join(directory, "model.ckpt")), "the checkpoint to be written")
    name = os.path.basename(directory)
    assert name != job_id and len(name) >= 32 and int(name, 16) >= 0, "named by a uid, not the job id"
    info = os.stat(directory)
    assert stat.S_IMODE(info.st_mode) == 0o700 and info.st_uid == 65534
    assert can_read_as(65534, directory)
    assert not can_read_as(1, directory), "another user lists the checkpoint directory"
    (task_dir,) = (cluster.root / "n1" / "tasks").glob(f"{job_id}.0.0@*")
    assert task_dir.name == f"{job_id}.0.0@{name}", "the task directory is named by the job uid too"
    task_order = task_dir / "task.json"
    assert stat.S_IMODE(os.stat(task_order).st_mode) == 0o600 and os.stat(task_order).st_uid == 0

    status, _ = cluster.api("POST", f"/api/v1/jobs/{job_id}/cancel", token=nobody)
    assert status in (200, 202), status
    cluster.wait_state(job_id, "CANCELLED")
    wait_for(lambda: not os.path.exists(directory), "the ended job's checkpoint directory to be deleted")


def test_a_store_made_anew_gives_job_1_another_empty_checkpoint_dir(cluster, shared_workdir):
    nobody = cluster.token_for("nobody")
    first = cluster.submit(token=nobody, command=["/bin/sh", "-c", WRITE_AND_WAIT], cpus=0.1, memory_gib=0.1,
                           workdir=str(shared_workdir))
    assert first == "1"
    cluster.wait_state(first, "RUNNING")
    old_dir = output_lines(shared_workdir, first)[0]
    wait_for(lambda: os.path.exists(os.path.join(old_dir, "model.ckpt")), "the checkpoint to be written")
    (shared_workdir / f"gpud-{first}.out").unlink()

    # The store is lost while job 1 runs, so nothing purges its directory: a new cluster starts over.
    cluster.controller.stop(signal.SIGKILL)
    cluster.nodes["n1"].stop(signal.SIGKILL)
    shutil.rmtree(cluster.state_dir)
    (cluster.root / "n1" / "cluster.id").unlink()
    cluster.start_controller()
    cluster.start_node("n1", gpus=2)
    # The new cluster does not know the old job 1: the node stops it and forgets its task, and, told that
    # job is gone, deletes its checkpoint directory.
    wait_for(lambda: not list((cluster.root / "n1" / "tasks").glob("1.0.0@*")), "the old job 1 to be stopped")
    wait_for(lambda: not os.path.exists(old_dir), "the old job 1's checkpoint directory to be purged")

    again = cluster.submit(token=cluster.token_for("daemon"), command=["/bin/sh", "-c", LIST], cpus=0.1,
                           memory_gib=0.1, workdir=str(shared_workdir))
    assert again == "1"
    assert cluster.wait_state(again, "COMPLETED", "FAILED")["state"] == "COMPLETED"
    lines = output_lines(shared_workdir, again, last="end")
    assert lines[0] != old_dir, "the new job 1 got the old job 1's checkpoint directory"
    assert lines[1:] == ["end"], f"the new job 1's checkpoint directory is not empty: {lines}"


def mode(path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


def test_state_directories_are_roots_and_a_script_still_runs_as_its_user(cluster, shared_workdir):
    node_dir = cluster.root / "n1"
    job_id = cluster.submit(token=cluster.token_for("nobody"), script="#!/bin/sh\nid -un\nexec sleep 300\n",
                            cpus=0.1, memory_gib=0.1, workdir=str(shared_workdir))
    cluster.wait_state(job_id, "RUNNING")
    assert output_lines(shared_workdir, job_id) == ["nobody"]
    (task_dir,) = (node_dir / "tasks").glob(f"{job_id}.0.0*")
    # Root's alone: the tasks directory, each task's directory (order, environment, script), the order itself.
    assert (mode(node_dir / "tasks"), mode(task_dir), mode(task_dir / "task.json")) == (0o700, 0o700, 0o600)
    assert os.stat(task_dir / "task.json").st_uid == 0
    # Only traversed by users: what leads to their checkpoint directories.
    assert (mode(node_dir), mode(node_dir / "checkpoints")) == (0o711, 0o711)
    for path in (node_dir, node_dir / "tasks", node_dir / "checkpoints", task_dir):
        assert not can_read_as(65534, str(path)), f"nobody lists {path}"


def stop_all(cluster) -> None:
    cluster.controller.stop(signal.SIGKILL)
    cluster.nodes["n1"].stop(signal.SIGKILL)


def test_a_controller_restored_from_a_backup_never_takes_an_old_task_for_its_new_job(cluster, shared_workdir):
    cluster.controller.stop()
    backup = cluster.root / "backup"
    shutil.copytree(cluster.state_dir, backup)  # taken before job 1 existed
    cluster.start_controller()
    nobody = cluster.token_for("nobody")
    old = cluster.submit(token=nobody, command=["/bin/sh", "-c", WRITE_AND_WAIT], cpus=0.1, memory_gib=0.1,
                         workdir=str(shared_workdir))
    assert old == "1"
    cluster.wait_state(old, "RUNNING")
    old_dir = output_lines(shared_workdir, old)[0]
    (shared_workdir / f"gpud-{old}.out").unlink()

    # The controller is restored from the backup while the old job 1 runs on; its new job 1 is submitted
    # before the node is back, so the node comes back with a task of "job 1" that is not this job 1.
    stop_all(cluster)
    shutil.rmtree(cluster.state_dir)
    shutil.copytree(backup, cluster.state_dir)
    cluster.start_controller()
    again = cluster.submit(token=cluster.token_for("daemon"), command=["/bin/sh", "-c", LIST], cpus=0.1,
                           memory_gib=0.1, workdir=str(shared_workdir))
    assert again == "1"
    cluster.start_node("n1", gpus=2)
    job = cluster.wait_state(again, "COMPLETED", "FAILED", timeout=40)
    assert job["state"] == "COMPLETED", job
    lines = output_lines(shared_workdir, again, last="end")
    assert lines[0] != old_dir and lines[1:] == ["end"], lines
    # The old task was stopped as not wanted, and its checkpoint directory, of a job this controller does
    # not have, was purged once it had stopped.
    wait_for(lambda: not list((cluster.root / "n1" / "tasks").glob(f"1.0.0@{os.path.basename(old_dir)}")),
             "the old job 1's task to be stopped and forgotten")
    wait_for(lambda: not os.path.exists(old_dir), "the old job 1's checkpoint directory to be purged")


def test_a_purge_missed_while_the_node_was_away_happens_when_it_is_back(cluster, shared_workdir):
    nobody = cluster.token_for("nobody")
    job_id = cluster.submit(token=nobody, command=["/bin/sh", "-c", WRITE_AND_WAIT], cpus=0.1, memory_gib=0.1,
                            workdir=str(shared_workdir))
    cluster.wait_state(job_id, "RUNNING")
    directory = output_lines(shared_workdir, job_id)[0]
    wait_for(lambda: os.path.exists(os.path.join(directory, "model.ckpt")), "the checkpoint to be written")
    cluster.nodes["n1"].stop(signal.SIGKILL)  # its task runs on under its supervisor
    time.sleep(1)  # the controller sees the connection close
    status, _ = cluster.api("POST", f"/api/v1/jobs/{job_id}/cancel", token=nobody)
    assert status in (200, 202), status
    cluster.wait_state(job_id, "CANCELLED")
    cluster.wait_cycles(1)
    assert os.path.exists(directory), "deleted with no node daemon running?"
    cluster.start_node("n1", gpus=2)
    wait_for(lambda: not os.path.exists(directory), "the checkpoint directory to be purged once the node is back")
