"""The controller's store is never lost quietly: real `gpud controller` processes on 127.0.0.1 and real SQLite files.

A missing, empty, damaged or foreign store is refused at start (only
--init makes a new cluster), two controllers never share a state directory,
`gpud backup` copies the store while the controller serves, and that copy
brings the cluster back.
"""

from __future__ import annotations

import os
import shutil
import signal
import sqlite3
import stat
import subprocess
import sys

import pytest

from daemons import LiveCluster, wait_for


def controller(cluster: LiveCluster, *args: str) -> subprocess.CompletedProcess:
    """Run `gpud controller` on the cluster's files until it exits (it should refuse to start)."""
    return subprocess.run([sys.executable, "-m", "gpud.cli.gpud_main", "controller", "--config", str(cluster.config),
                           *args], capture_output=True, text=True, timeout=60)


def gpud(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "gpud.cli.gpud_main", *args], capture_output=True, text=True,
                          timeout=60)


def assert_refused(result: subprocess.CompletedProcess, *words: str) -> None:
    assert result.returncode == 1, (result.returncode, result.stderr)
    assert "Traceback" not in result.stderr, result.stderr
    for word in ("gpud backup", "--init", *words):
        assert word in result.stderr, (word, result.stderr)


@pytest.fixture
def cluster(tmp_path):
    live = LiveCluster(tmp_path)
    try:
        yield live
    finally:
        live.close()


def started(cluster: LiveCluster) -> LiveCluster:
    cluster.start_controller()
    return cluster


def test_a_new_state_directory_needs_init(cluster):
    assert_refused(controller(cluster), "does not exist", "If this is a new cluster")
    assert not (cluster.state_dir / "gpud.sqlite").exists()
    started(cluster)   # with --init
    assert cluster.api("GET", "/api/v1/whoami")[0] == 200


def test_an_empty_store_is_refused_and_nothing_is_forgotten(cluster):
    started(cluster)
    job_id = cluster.submit(command=["true"], hold=True)
    cluster.controller.stop()
    store = cluster.state_dir / "gpud.sqlite"
    os.rename(store, cluster.root / "saved.sqlite")
    store.write_bytes(b"")
    assert_refused(controller(cluster), "is empty (zero bytes)")
    assert store.stat().st_size == 0
    os.replace(cluster.root / "saved.sqlite", store)
    cluster.start_controller()
    assert cluster.job(job_id)["state"] == "PENDING"


def test_a_damaged_store_fails_with_a_clear_message(cluster):
    started(cluster)
    cluster.controller.stop()
    store = cluster.state_dir / "gpud.sqlite"
    for name in ("gpud.sqlite-wal", "gpud.sqlite-shm"):
        (cluster.state_dir / name).unlink(missing_ok=True)
    store.write_bytes(b"this is not an SQLite file at all" * 200)
    assert_refused(controller(cluster), "is damaged")
    assert_refused(controller(cluster, "--init"), "is damaged")   # --init never overwrites what is there


def test_a_store_damaged_inside_fails_with_a_clear_message(cluster):
    started(cluster)
    job = {"project": "alpha", "workdir": str(cluster.workdir), "command": ["true"], "hold": True,
           "env": {"PAD": "x" * 400}}
    status, body = cluster.api("POST", "/api/v1/jobs/batch", {"jobs": [job] * 2000})
    assert status == 201, body
    cluster.controller.stop()
    store = cluster.state_dir / "gpud.sqlite"
    assert not (cluster.state_dir / "gpud.sqlite-wal").exists()   # checkpointed on a clean stop
    size = store.stat().st_size
    with open(store, "r+b") as f:
        for offset in range(8192, size, 8192):    # the header is whole; the pages after it are not
            f.seek(offset)
            f.write(b"\xff" * 700)
    result = controller(cluster)
    assert_refused(result, "is damaged", "move", "aside")
    assert store.stat().st_size == size


def test_a_store_of_another_cluster_is_refused(cluster, tmp_path):
    started(cluster)
    cluster.controller.stop()
    (tmp_path / "other").mkdir()
    other = LiveCluster(tmp_path / "other")
    try:
        other.start_controller()
        other.controller.stop()
    finally:
        other.close()
    for name in ("gpud.sqlite", "gpud.sqlite-wal", "gpud.sqlite-shm"):
        (cluster.state_dir / name).unlink(missing_ok=True)
    shutil.copy(other.state_dir / "gpud.sqlite", cluster.state_dir / "gpud.sqlite")
    assert_refused(controller(cluster), "belongs to another cluster")
    ours = (cluster.state_dir / "cluster.id").read_text().strip()
    theirs = (other.state_dir / "cluster.id").read_text().strip()
    assert ours in controller(cluster).stderr and theirs in controller(cluster).stderr
    adopted = subprocess.Popen([sys.executable, "-m", "gpud.cli.gpud_main", "controller", "--config",
                                str(cluster.config), "--init"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_for(lambda: (cluster.state_dir / "cluster.id").read_text().strip() == theirs, "--init to adopt the store")
    finally:
        adopted.send_signal(signal.SIGTERM)
        adopted.wait(30)


def test_two_controllers_never_share_a_state_directory(cluster):
    started(cluster)
    second = controller(cluster, "--listen", "127.0.0.1:1")
    assert second.returncode == 1 and "Traceback" not in second.stderr
    assert f"another gpud controller (pid {cluster.controller.pid})" in second.stderr, second.stderr
    assert cluster.api("GET", "/api/v1/whoami")[0] == 200


def test_a_backup_taken_while_serving_brings_the_cluster_back(cluster):
    started(cluster)
    ids = [cluster.submit(command=["true"], hold=True) for _ in range(5)]
    alice = cluster.token_for("alice")
    cluster.token_for("bob")
    assert cluster.api("POST", "/api/v1/tokens/revoke", {"user": "bob"})[0] == 200  # kept, not counted
    dest = cluster.root / "backup.sqlite"
    made = gpud("backup", "--config", str(cluster.config), str(dest))
    assert made.returncode == 0, made.stderr
    assert "6 jobs" not in made.stdout and "5 jobs" in made.stdout and "2 tokens" in made.stdout
    assert stat.S_IMODE(dest.stat().st_mode) == 0o600
    with sqlite3.connect(dest) as db:
        assert db.execute("PRAGMA integrity_check").fetchone() == ("ok",)
    again = gpud("backup", "--config", str(cluster.config), str(dest))
    assert again.returncode == 1 and "already exists" in again.stderr
    later = cluster.submit(command=["true"], hold=True)
    cluster.controller.stop(signal.SIGKILL)
    for name in ("gpud.sqlite", "gpud.sqlite-wal", "gpud.sqlite-shm"):
        (cluster.state_dir / name).unlink(missing_ok=True)
    assert_refused(controller(cluster), "does not exist")
    shutil.copy(dest, cluster.state_dir / "gpud.sqlite")   # the restore the message describes
    cluster.start_controller()
    assert [cluster.job(i)["state"] for i in ids] == ["PENDING"] * 5
    assert cluster.api("GET", f"/api/v1/jobs/{later}")[0] == 404
    assert cluster.api("GET", "/api/v1/whoami", token=alice)[0] == 200
    assert int(cluster.submit(command=["true"], hold=True)) > int(ids[-1])


def test_a_backup_of_nothing_says_so(tmp_path):
    made = gpud("backup", "--state-dir", str(tmp_path / "nowhere"), str(tmp_path / "b.sqlite"))
    assert made.returncode == 1 and "no store to back up" in made.stderr
    assert not (tmp_path / "b.sqlite").exists()


def test_a_node_refuses_a_controller_of_another_cluster(cluster):
    started(cluster)
    cluster.start_node("n1", gpus=1)
    cluster.controller.stop()
    for name in ("gpud.sqlite", "gpud.sqlite-wal", "gpud.sqlite-shm", "cluster.id"):
        (cluster.state_dir / name).unlink(missing_ok=True)
    cluster.start_controller()   # --init: a new cluster with the same key
    wait_for(lambda: "belongs to cluster" in cluster.nodes["n1"].output(), "the node to refuse the controller")
    assert cluster.node_state("n1") is None
    assert "refused node 'n1' of another cluster" in cluster.controller.output()


def test_gpud_up_refuses_an_emptied_store_and_says_how_to_start_afresh(tmp_path):
    from daemons import free_port

    controller_dir = tmp_path / "state" / "controller"
    controller_dir.mkdir(parents=True)
    (controller_dir / "gpud.sqlite").write_bytes(b"")
    env = {**os.environ, "XDG_CONFIG_HOME": str(tmp_path / "config")}
    result = subprocess.run([sys.executable, "-m", "gpud.cli.gpud_main", "up", "--fake-gpus", "1", "--state-dir",
                             str(tmp_path / "state"), "--port", str(free_port()), "--exit-when-idle"],
                            capture_output=True, text=True, timeout=120, env=env)
    assert result.returncode != 0 and "Traceback" not in result.stderr
    assert "is empty (zero bytes)" in result.stderr and f"move {controller_dir} aside" in result.stderr


def test_a_directory_in_place_of_the_store_is_named_without_a_traceback(cluster):
    cluster.state_dir.mkdir()
    (cluster.state_dir / "gpud.sqlite").mkdir()
    for args in ((), ("--init",)):
        result = controller(cluster, *args)
        assert_refused(result, f"{cluster.state_dir / 'gpud.sqlite'} is a directory, not a file", "move it aside")
    (cluster.state_dir / "gpud.sqlite").rmdir()
    (cluster.state_dir / "gpud.sqlite-wal").mkdir()
    assert_refused(controller(cluster, "--init"), f"{cluster.state_dir / 'gpud.sqlite-wal'} is a directory")


def test_a_file_in_place_of_the_state_directory_is_named_without_a_traceback(cluster):
    cluster.state_dir.write_text("not a directory\n")
    result = controller(cluster, "--init")
    assert result.returncode == 1 and "Traceback" not in result.stderr, result.stderr
    assert f"cannot use the state directory {cluster.state_dir}: it is" in result.stderr, result.stderr
    assert "not a directory" in result.stderr, result.stderr


def test_a_missing_parent_of_the_state_directory_is_made(tmp_path):
    live = LiveCluster(tmp_path)
    live.state_dir = tmp_path / "not" / "yet" / "there"
    live.config.write_text(live.config.read_text().replace(str(tmp_path / "controller"), str(live.state_dir)))
    try:
        live.start_controller()
        assert live.api("GET", "/api/v1/whoami")[0] == 200
    finally:
        live.close()


@pytest.fixture
def read_only(tmp_path):
    """A read-only tmpfs at tmp_path/ro holding a state directory with a store (skipped when mount is impossible)."""
    where = tmp_path / "ro"
    where.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(where)], capture_output=True,
                          text=True)
    if done.returncode != 0:
        pytest.skip(f"a read-only filesystem needs mount (root): {done.stderr.strip()}")
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], check=False)


def test_an_unwritable_state_directory_is_named_without_a_traceback(tmp_path, read_only):
    live = LiveCluster(tmp_path)
    live.state_dir = read_only / "state"
    live.config.write_text(live.config.read_text().replace(str(tmp_path / "controller"), str(live.state_dir)))
    live.start_controller()            # a cluster with a store, then its filesystem made read-only
    live.controller.stop()
    live.controller = None
    subprocess.run(["mount", "-o", "remount,ro", str(read_only)], check=True)
    result = controller(live)
    assert result.returncode == 1 and "Traceback" not in result.stderr, result.stderr
    assert f"cannot use the state directory {live.state_dir}" in result.stderr, result.stderr
    assert "Read-only file system" in result.stderr, result.stderr
