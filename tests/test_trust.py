"""Who sees and runs what, against a real controller and node daemon on 127.0.0.1.

A job's command, environment and paths are its owner's (and the admins');
the controller's files holding them are its own alone.
"""

from __future__ import annotations

import os
import stat
import time

import pytest

from daemons import LiveCluster
from gpud.cli.job_cmd import show_text

SECRET = "hf_s3cr3t-value"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    live = LiveCluster(tmp_path_factory.mktemp("trust"))
    try:
        live.start_controller()
        live.start_node("n1", gpus=2)
        live.alice = live.token_for("alice")
        live.bob = live.token_for("bob")
        yield live
    finally:
        live.close()


def alice_job(cluster: LiveCluster, **extra) -> str:
    """A held job of alice's carrying a secret in its environment and its command."""
    return cluster.submit(token=cluster.alice, command=["python3", "train.py", f"--key={SECRET}"],
                          env={"HF_TOKEN": SECRET}, output="secret/%j.out", error="secret/%j.err",
                          hold=True, cpus=0.1, memory_gib=0.1, **extra)


CONFIDENTIAL = ("command", "script", "env", "workdir", "output", "error")


def assert_public_only(view: dict) -> None:
    assert view["confidential"] is True
    for key in CONFIDENTIAL:
        assert key not in view, (key, view)
    assert SECRET not in repr(view) and "secret/" not in repr(view)


def test_another_user_sees_only_the_public_fields_of_a_job(cluster):
    job_id = alice_job(cluster, name="finetune")
    status, seen = cluster.api("GET", f"/api/v1/jobs/{job_id}", token=cluster.bob)
    assert status == 200
    assert_public_only(seen)
    assert (seen["id"], seen["user"], seen["name"], seen["state"]) == (job_id, "alice", "finetune", "PENDING")
    status, listing = cluster.api("GET", "/api/v1/jobs", token=cluster.bob)
    mine = [job for job in listing["jobs"] if job["id"] == job_id]
    assert len(mine) == 1
    assert_public_only(mine[0])
    status, why = cluster.api("GET", f"/api/v1/jobs/{job_id}/why", token=cluster.bob)
    assert status == 200 and SECRET not in repr(why)
    text = show_text(seen, time.time())
    assert "only its owner and admins see its command" in text and SECRET not in text


def test_the_owner_and_an_admin_see_everything(cluster):
    job_id = alice_job(cluster)
    for token in (cluster.alice, "admin"):
        status, seen = cluster.api("GET", f"/api/v1/jobs/{job_id}", token=token)
        assert status == 200
        assert seen["env"] == {"HF_TOKEN": SECRET}
        assert seen["command"][-1] == f"--key={SECRET}"
        assert seen["workdir"] == str(cluster.workdir) and seen["output"] == "secret/%j.out"
        assert "confidential" not in seen


def test_finished_jobs_stay_confidential_in_history_and_listings(cluster):
    job_id = alice_job(cluster)
    status, _ = cluster.api("POST", f"/api/v1/jobs/{job_id}/cancel", token=cluster.alice)
    assert status == 200
    status, history = cluster.api("GET", "/api/v1/history?user=alice&limit=50", token=cluster.bob)
    assert status == 200
    ended = [job for job in history["jobs"] if job["id"] == job_id]
    assert len(ended) == 1 and ended[0]["state"] == "CANCELLED"
    assert_public_only(ended[0])
    status, listing = cluster.api("GET", "/api/v1/jobs?all=1", token=cluster.bob)
    assert_public_only(next(job for job in listing["jobs"] if job["id"] == job_id))
    status, shown = cluster.api("GET", f"/api/v1/jobs/{job_id}", token=cluster.bob)
    assert_public_only(shown)
    status, own = cluster.api("GET", "/api/v1/history?user=alice&limit=50", token=cluster.alice)
    assert next(job for job in own["jobs"] if job["id"] == job_id)["env"] == {"HF_TOKEN": SECRET}


def test_another_users_log_is_refused(cluster):
    job_id = alice_job(cluster)
    status, body = cluster.api("GET", f"/api/v1/jobs/{job_id}/logs", token=cluster.bob)
    assert status == 403 and SECRET not in repr(body)


def test_the_controllers_files_are_its_own_alone(cluster):
    alice_job(cluster)   # something written, so the WAL exists
    state = cluster.state_dir
    assert stat.S_IMODE(os.stat(state).st_mode) == 0o700
    for name in ("gpud.sqlite", "gpud.sqlite-wal", "gpud.sqlite-shm", "cluster.key", "admin.token"):
        assert stat.S_IMODE(os.stat(state / name).st_mode) == 0o600, name
