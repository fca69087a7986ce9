"""`gpud store copy`: a SQLite cluster moves into PostgreSQL whole, and a controller on PostgreSQL serves it."""

from __future__ import annotations

import subprocess
import sys

import pytest

from daemons import POLICY, LiveCluster, Process, free_port, wait_for
from gpud.store.postgres import PostgresStore
from gpud.store.sqlite import SQLiteStore

pytestmark = pytest.mark.timeout(180)


def gpud(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "gpud.cli.gpud_main", *args], capture_output=True, text=True,
                          timeout=60)


def role(cluster: LiveCluster) -> str | None:
    try:
        return cluster.api("GET", "/healthz", token=None)[1]["role"]
    except OSError:
        return None


def test_a_sqlite_cluster_moves_into_postgresql_and_is_served_from_it(tmp_path, pg_url):
    cluster = LiveCluster(tmp_path)
    cluster.start_controller()
    try:
        user = cluster.token_for("ann")
        held = cluster.submit(command=["true"], hold=True, name="kept")
        done = cluster.submit(command=["true"], hold=True, name="cancelled")
        assert cluster.api("POST", f"/api/v1/jobs/{done}/cancel")[0] == 200
        refused = gpud("store", "copy", "--from", f"sqlite:{cluster.state_dir}", "--to", pg_url)
        assert refused.returncode == 1 and "stop it first" in refused.stderr
    finally:
        cluster.controller.stop()
    sqlite = SQLiteStore(cluster.state_dir)
    before = sqlite.load()
    events = sqlite.events(held)
    sqlite.close()

    copied = gpud("store", "copy", "--from", f"sqlite:{cluster.state_dir}", "--to", pg_url)
    assert copied.returncode == 0, copied.stderr
    assert "copied 2 jobs" in copied.stdout
    store = PostgresStore(pg_url, fenced=False)
    try:
        after = store.load()
        assert after.jobs == before.jobs and after.tokens == before.tokens and after.nodes == before.nodes
        assert after.meta["cluster_id"] == before.meta["cluster_id"]
        assert after.meta["cluster_key"] == (cluster.state_dir / "cluster.key").read_text().strip()
        assert store.events(held) == events
        assert store.jobs_state([done]) == {done: "CANCELLED"}
    finally:
        store.close()
    again = gpud("store", "copy", "--from", f"sqlite:{cluster.state_dir}", "--to", pg_url)
    assert again.returncode == 1 and "already holds a cluster" in again.stderr

    # A controller on the database, with a state directory of its own and no --init, serves the cluster.
    port = free_port()
    controller = Process(["controller", "--listen", f"127.0.0.1:{port}", "--state-dir", str(tmp_path / "pg"),
                          "--policy", str(cluster.policy_file), "--store", pg_url], tmp_path / "pg.log")
    try:
        cluster.url = f"http://127.0.0.1:{port}"
        wait_for(lambda: role(cluster) == "leader", f"the controller to lead\n{controller.output()}")
        assert cluster.job(held)["name"] == "kept" and cluster.job(done)["state"] == "CANCELLED"
        assert cluster.api("GET", "/api/v1/jobs", token=user)[0] == 200  # tokens came along
        new = cluster.submit(command=["true"], hold=True)
        assert int(new) > int(held)  # ids go on after the copied ones
    finally:
        controller.stop()


def test_a_database_without_a_cluster_is_refused_without_init(tmp_path, pg_url):
    (tmp_path / "policy.toml").write_text(POLICY)
    answer = gpud("controller", "--listen", f"127.0.0.1:{free_port()}", "--state-dir", str(tmp_path / "s"),
                  "--policy", str(tmp_path / "policy.toml"), "--store", pg_url)
    assert answer.returncode == 1
    assert "holds no gpud cluster" in answer.stderr and "--init" in answer.stderr
