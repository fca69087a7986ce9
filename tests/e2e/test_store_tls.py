"""Controllers reach PostgreSQL over TLS as the store URL's sslmode says; a wrong or missing CA is refused in words.

A throwaway PostgreSQL server serves TLS with a certificate made by `gpud
cert`; the controllers' URL asks for ``sslmode=verify-full`` against the
cluster CA. Every connection they make (store, lease, a standby's reads,
`gpud store copy`) must then be encrypted, which the server itself
reports in ``pg_stat_ssl``.
"""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

import psycopg
import pytest

from daemons import POLICY, LiveCluster, free_port, wait_for
from gpud.testing.pg_server import Server, bin_dir
from ha_cluster import HaCluster

pytestmark = pytest.mark.timeout(240)
PASSWORD = "s3cret-pw"  # trust authentication ignores it; it must never be shown


def gpud(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "gpud.cli.gpud_main", *args], capture_output=True, text=True,
                          timeout=90)


@pytest.fixture(scope="module")
def certs(tmp_path_factory) -> Path:
    """The cluster CA with a certificate for 127.0.0.1 (the server's), and a second CA that signed nothing of it."""
    root = tmp_path_factory.mktemp("pg-tls")
    for args in (("ca", str(root / "ca")),
                 ("issue", "--ca", str(root / "ca"), "--name", "db", "--host", "127.0.0.1", "--host", "localhost"),
                 ("ca", str(root / "other"))):
        made = gpud("cert", *args)
        assert made.returncode == 0, made.stderr
    return root


@pytest.fixture(scope="module")
def tls_server(certs):
    """A PostgreSQL server with ssl = on, its certificate and key from `gpud cert issue`."""
    if bin_dir() is None:
        pytest.skip("PostgreSQL is not installed (.ci/run installs it)")
    server = Server(ssl_cert=str(certs / "ca" / "db.pem"), ssl_key=str(certs / "ca" / "db.key"))
    yield server
    server.stop()


@pytest.fixture
def database(tls_server):
    """A new database on the TLS server: its plain URL (no sslmode), dropped afterwards."""
    url = tls_server.database()
    yield url
    tls_server.drop(url)


def with_tls(url: str, ca: Path, password: bool = False) -> str:
    """``url`` asking for a verified TLS connection against ``ca`` (with a password in the user part, if asked)."""
    if password:
        url = url.replace("postgresql://gpud@", f"postgresql://gpud:{PASSWORD}@")
    return f"{url}?sslmode=verify-full&sslrootcert={ca}"


def encrypted(url: str, application: str) -> list[bool]:
    """For each session of ``application`` (a prefix) now connected to the server: whether it uses TLS."""
    with psycopg.connect(url, autocommit=True) as db:
        return [row[0] for row in db.execute(
            "SELECT s.ssl FROM pg_stat_ssl s JOIN pg_stat_activity a USING (pid) "
            "WHERE a.application_name LIKE %s AND a.pid != pg_backend_pid()", (application + "%",))]


def test_controllers_use_tls_for_every_connection_and_store_a_submitted_job(tmp_path, certs, database):
    store = with_tls(database, certs / "ca" / "ca.pem", password=True)
    cluster = HaCluster(tmp_path, store)
    try:
        leader = cluster.start_controller(0, init=True)
        cluster.wait_leader(0)
        cluster.start_controller(1)
        wait_for(lambda: cluster.role(1) == "standby", "c1 to stand by")
        status, answer, _ = cluster.api(0, "POST", "/api/v1/jobs",
                                        {"project": "alpha", "command": ["true"], "workdir": str(cluster.workdir),
                                         "hold": True, "name": "over-tls"})
        assert status == 201, answer
        job = answer["ids"][0]
        with psycopg.connect(store, autocommit=True) as db:
            assert db.execute("SELECT state FROM jobs WHERE id = %s", (job,)).fetchone() == ("PENDING",)
        # The leader's store, its reader and lease, and the standby's lease and reads: all of them encrypted.
        sessions = wait_for(lambda: len(s := encrypted(store, "gpud controller")) >= 3 and s, "controllers' sessions")
        assert all(sessions), sessions
        assert PASSWORD not in leader.output() and PASSWORD not in cluster.controllers[1].output()
        assert "gpud:***@127.0.0.1" in leader.output()  # the URL it serves from, password masked
    finally:
        cluster.close()


def start_controller(root: Path, store: str) -> subprocess.CompletedProcess:
    """`gpud controller --init` on ``store`` with a state directory of its own; what it printed once it ended."""
    root.mkdir()
    (root / "policy.toml").write_text(POLICY)
    return gpud("controller", "--store", store, "--state-dir", str(root / "state"), "--policy",
                str(root / "policy.toml"), "--listen", f"127.0.0.1:{free_port()}", "--init")


def test_a_wrong_or_missing_ca_is_refused_with_the_store_named_and_no_password(tmp_path, certs, database):
    wrong = with_tls(database, certs / "other" / "ca.pem", password=True)
    shown = wrong.replace(PASSWORD, "***")
    refused = start_controller(tmp_path / "a", wrong)
    assert refused.returncode == 1, refused.stderr
    assert f"cannot use the database {shown}" in refused.stderr and "certificate verify failed" in refused.stderr
    assert "Traceback" not in refused.stderr and PASSWORD not in refused.stderr

    missing = with_tls(database, tmp_path / "no-ca.pem", password=True)
    refused = start_controller(tmp_path / "b", missing)
    assert refused.returncode == 1, refused.stderr
    assert f"root certificate file \"{tmp_path / 'no-ca.pem'}\" does not exist" in refused.stderr
    assert "Traceback" not in refused.stderr and PASSWORD not in refused.stderr

    # A server that speaks no TLS cannot satisfy sslmode=require (and the URL reaches the driver as given).
    plain = database.replace("postgresql://gpud@", f"postgresql://gpud:{PASSWORD}@") + "?sslmode=disable"
    with psycopg.connect(plain) as db:
        assert db.execute("SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()").fetchone() == (False,)


def test_store_copy_honours_sslmode(tmp_path, certs, database):
    cluster = LiveCluster(tmp_path)
    cluster.start_controller()
    try:
        job = cluster.submit(command=["true"], hold=True, name="moved")
    finally:
        cluster.controller.stop()
    wrong = gpud("store", "copy", "--from", f"sqlite:{cluster.state_dir}",
                 "--to", with_tls(database, certs / "other" / "ca.pem", password=True))
    assert wrong.returncode == 1 and "certificate verify failed" in wrong.stderr, wrong.stderr
    assert "cannot write the database postgresql://gpud:***@" in wrong.stderr and PASSWORD not in wrong.stderr

    store = with_tls(database, certs / "ca" / "ca.pem", password=True)
    copied = gpud("store", "copy", "--from", f"sqlite:{cluster.state_dir}", "--to", store)
    assert copied.returncode == 0, copied.stderr
    assert PASSWORD not in copied.stdout + copied.stderr
    with psycopg.connect(store, autocommit=True) as db:
        assert db.execute("SELECT state FROM jobs WHERE id = %s", (job,)).fetchone() == ("PENDING",)


def test_gpud_up_keeps_its_cluster_in_postgresql_over_tls(tmp_path, certs, database):
    from test_up import Up
    from node_helpers import kill_everything

    store = with_tls(database, certs / "ca" / "ca.pem", password=True)
    up = Up(tmp_path, "--fake-gpus", "2", "--store", store)
    try:
        up.start()
        submitted = up.gpuctl("submit", "--parsable", "--gpus", "1", "--", "true")
        assert submitted.returncode == 0, submitted.stderr
        job = submitted.stdout.strip()
        assert up.wait_state(job, "COMPLETED")["exit_code"] == 0
        with psycopg.connect(store, autocommit=True) as db:
            assert db.execute("SELECT state FROM jobs WHERE id = %s", (job,)).fetchone() == ("COMPLETED",)
        assert all(encrypted(store, "gpud controller"))
        assert up.stop() == 0
        assert PASSWORD not in up.output()
    finally:
        up.stop(signal.SIGKILL)
        kill_everything(str(up.state_dir / "node"))

    (tmp_path / "wrong").mkdir()
    wrong = Up(tmp_path / "wrong", "--fake-gpus", "2", "--store", with_tls(database, certs / "other" / "ca.pem"))
    wrong.start(wait=False)
    assert wrong.popen.wait(60) == 1
    assert "certificate verify failed" in wrong.output() and "Traceback" not in wrong.output()
