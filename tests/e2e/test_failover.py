"""Two controllers on one PostgreSQL: one leads, the other stands by and takes over, and the cluster goes on.

Real processes throughout: two `gpud controller` processes on one
throwaway PostgreSQL server, a node daemon given both URLs, clients given
both URLs. The leader is killed with SIGKILL while clients submit; or
stopped with SIGSTOP past its lease and continued, when it must write
nothing and step down.
"""

from __future__ import annotations

import signal
import threading
import time

import pytest

from daemons import wait_for
from ha_cluster import HaCluster

pytestmark = pytest.mark.timeout(240)


@pytest.fixture
def ha(tmp_path, pg_url):
    cluster = HaCluster(tmp_path, pg_url)
    try:
        yield cluster
    finally:
        cluster.close()


def start_pair(ha: HaCluster) -> None:
    ha.start_controller(0, init=True)
    ha.wait_leader(0)
    ha.start_controller(1)
    wait_for(lambda: (h := ha.health(1)) is not None and h["role"] == "standby" and h["leader"] == ha.urls[0],
             "c1 to stand by and name the leader")


def running_job(ha: HaCluster) -> dict:
    client = ha.client()
    ha.start_node("n1", gpus=2)
    answer = client.post("jobs", {"project": "alpha", "workdir": str(ha.workdir), "command": ["sleep", "600"],
                                  "gpus": 1, "name": "long"}, idempotent=True)
    job_id = answer["ids"][0]
    return wait_for(lambda: (job := client.get(f"jobs/{job_id}"))["state"] == "RUNNING" and job,
                    f"job {job_id} to run")


def test_a_standby_sends_clients_to_the_leader(ha):
    start_pair(ha)
    assert ha.health(0)["role"] == "leader" and ha.health(1)["role"] == "standby"
    assert ha.health(1)["leader"] == ha.urls[0]
    status, body, headers = ha.api(1, "GET", "/api/v1/jobs")
    assert status == 503
    assert body["leader"] == ha.urls[0] and headers["X-Gpud-Leader"] == ha.urls[0]
    assert "standby" in body["error"]
    # A client given the standby's URL first goes on to the leader, even with a request not safe to repeat.
    from gpud.client import Client
    remember = str(ha.root / "cache" / "leader.json")
    client = Client(f"{ha.urls[1]},{ha.urls[0]}", ha.admin_token, remember=remember)
    job = client.post("jobs", {"project": "alpha", "workdir": str(ha.workdir), "command": ["true"], "hold": True},
                      idempotent=False)
    assert client.url == ha.urls[0]
    assert client.get(f"jobs/{job['ids'][0]}")["state"] == "PENDING"
    # The next client (the next gpuctl command) given the same URLs starts with the leader.
    assert Client(f"{ha.urls[1]},{ha.urls[0]}", ha.admin_token, remember=remember).url == ha.urls[0]
    assert Client(f"{ha.urls[1]},{ha.urls[0]}", ha.admin_token).url == ha.urls[1]


def test_a_standby_keeps_the_jobs_decoded_and_a_takeover_reads_them_right(ha):
    start_pair(ha)
    client = ha.client()
    first = [client.post("jobs", {"project": "alpha", "workdir": str(ha.workdir), "command": ["true"],
                                  "hold": True, "name": f"early-{n}"}, idempotent=True)["ids"][0] for n in range(3)]
    wait_for(lambda: ha.health(1)["warm_jobs"] == 3, "the standby to decode the jobs ahead")
    client.post(f"jobs/{first[0]}/cancel")  # changed after the standby decoded it: no longer active
    client.post(f"jobs/{first[1]}/release")  # changed and still active: read again, not taken as decoded
    late = client.post("jobs", {"project": "alpha", "workdir": str(ha.workdir), "command": ["true"], "hold": True,
                                "name": "late"}, idempotent=True)["ids"][0]
    ha.kill(0)
    health = ha.wait_leader(1)
    assert health["takeover"]["warm_jobs"] >= 1  # early-2 at least: unchanged since it was decoded
    jobs = {job["id"]: job for job in client.get_all("jobs")["jobs"]}
    assert client.get(f"jobs/{first[0]}")["state"] == "CANCELLED"
    assert [jobs[i]["name"] for i in (*first[1:], late)] == ["early-1", "early-2", "late"]
    assert all(jobs[i]["state"] == "PENDING" for i in (*first[1:], late))
    assert [jobs[i]["hold"] for i in (*first[1:], late)] == [False, True, True]


def test_kill_9_of_the_leader_during_submits_loses_nothing_and_keeps_the_job_running(ha):
    start_pair(ha)
    long = running_job(ha)
    stop = threading.Event()
    acknowledged: list[list[str]] = [[] for _ in range(4)]
    errors: list[BaseException] = []

    def submit(worker: int) -> None:
        client = ha.client(retry_s=60.0, connect_retry_s=60.0)
        index = 0
        while not stop.is_set():
            body = {"project": "alpha", "workdir": str(ha.workdir), "command": ["true"], "hold": True,
                    "name": f"w{worker}-{index}"}
            try:
                acknowledged[worker].append(client.post("jobs", body, idempotent=True)["ids"][0])
            except BaseException as exc:  # noqa: BLE001 - reported below
                errors.append(exc)
                return
            index += 1

    workers = [threading.Thread(target=submit, args=(w,)) for w in range(4)]
    for worker in workers:
        worker.start()
    try:
        wait_for(lambda: sum(map(len, acknowledged)) >= 20, "submits to be acknowledged")
        ha.kill(0)
        killed = time.monotonic()
        before = sum(map(len, acknowledged))
        health = ha.wait_leader(1, timeout=60)
        wait_for(lambda: sum(map(len, acknowledged)) > before + 20, "submits to go on with c1", timeout=60)
        resumed_s = time.monotonic() - killed
    finally:
        stop.set()
        for worker in workers:
            worker.join(120)
    assert not errors, errors
    assert health["term"] == 2
    assert health["takeover"]["first_cycle_s"] < 5.0
    assert resumed_s < 30.0
    client = ha.client()
    ids = [job_id for worker in acknowledged for job_id in worker]
    assert len(ids) == len(set(ids)), "one job acknowledged twice"
    listed = client.get_all("jobs", {"state": "PENDING"})["jobs"]
    names = [job["name"] for job in listed]
    assert len(names) == len(set(names)), "a submit made two jobs"
    assert {job["id"] for job in listed} == set(ids), "an acknowledged job was lost (or one was never told)"
    # The running job ran on: same placement, never requeued.
    wait_for(lambda: ha.node_state("n1") == "up", "n1 to register with c1")
    now = client.get(f"jobs/{long['id']}")
    assert now["state"] == "RUNNING" and now["restart_count"] == 0
    assert now["started"] == long["started"]


AUDIT = """
CREATE TABLE audit (at TIMESTAMPTZ NOT NULL, who TEXT NOT NULL, tab TEXT NOT NULL);
CREATE FUNCTION audit_row() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO audit VALUES (clock_timestamp(), current_setting('application_name'), TG_TABLE_NAME);
    RETURN NULL;
END $$;
"""
AUDITED = ("jobs", "events", "nodes", "tokens", "meta", "answers", "usage", "usage_clock")


def test_a_leader_paused_past_its_lease_writes_nothing_and_steps_down(ha, pg_url):
    import psycopg
    start_pair(ha)
    long = running_job(ha)
    paused_pid = ha.controllers[0].pid
    with psycopg.connect(pg_url, autocommit=True) as db:
        db.execute(AUDIT)
        for table in AUDITED:
            db.execute(f"CREATE TRIGGER audit_{table} AFTER INSERT OR UPDATE OR DELETE ON {table} "
                       f"FOR EACH ROW EXECUTE FUNCTION audit_row()")
        client = ha.client(timeout=3.0)
        client.post("jobs", {"project": "alpha", "workdir": str(ha.workdir), "command": ["true"], "hold": True},
                    idempotent=True)
        assert db.execute("SELECT count(*) FROM audit WHERE who LIKE %s",
                          (f"%:{paused_pid}:%",)).fetchone()[0] > 0  # the audit sees the leader's writes
        ha.kill(0, signal.SIGSTOP)
        try:
            ha.wait_leader(1, timeout=60)
            assert client.url == ha.urls[0]  # its first try is the stopped leader: it moves on by itself
            held = client.post("jobs", {"project": "alpha", "workdir": str(ha.workdir), "command": ["true"],
                                        "hold": True}, idempotent=True)["ids"][0]
            assert client.url == ha.urls[1]
            (took_over,) = db.execute("SELECT since FROM lease WHERE term = 2").fetchone()
            assert db.execute("SELECT count(*) FROM audit WHERE who LIKE %s AND at > %s",
                              (f"%:{ha.controllers[1].pid}:%", took_over)).fetchone()[0] > 0
            # Submits sent to the stopped leader wait in its socket's queue: it reads them first when it wakes.
            late: list = []
            senders = [threading.Thread(target=lambda n=n: late.append(ha.api(0, "POST", "/api/v1/jobs", {
                "project": "alpha", "workdir": str(ha.workdir), "command": ["true"], "hold": True,
                "name": f"late-{n}"}))) for n in range(3)]
            for sender in senders:
                sender.start()
            time.sleep(0.5)  # let the requests reach the stopped process's socket
        finally:
            ha.kill(0, signal.SIGCONT)
        for sender in senders:
            sender.join(30)
        wait_for(lambda: "stepping down" in ha.controllers[0].log.read_text(), "the old leader to step down")
        wait_for(lambda: ha.role(0) == "standby", "the old leader to come back as a standby")
        assert ha.controllers[0].pid == paused_pid and ha.controllers[0].alive()
        written = db.execute("SELECT at, tab FROM audit WHERE who LIKE %s AND at > %s",
                             (f"%:{paused_pid}:%", took_over)).fetchall()
        assert written == [], f"the old leader wrote after the takeover: {written}"
        assert all(status != 201 for status, _, _ in late), late
        assert db.execute("SELECT count(*) FROM jobs WHERE record LIKE '%late-%'").fetchone()[0] == 0
    assert ha.health(1)["role"] == "leader"
    client = ha.client()
    assert client.get(f"jobs/{held}")["state"] == "PENDING"
    wait_for(lambda: ha.node_state("n1") == "up", "n1 to register with c1")
    now = client.get(f"jobs/{long['id']}")
    assert now["state"] == "RUNNING" and now["restart_count"] == 0
