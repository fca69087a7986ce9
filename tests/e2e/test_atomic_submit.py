"""A submit is all or nothing: a job exists only once its records are durable, against a real controller.

The store fails for real: the controller's state directory is a small tmpfs
that the test fills, so SQLite answers "database or disk is full".
"""

from __future__ import annotations

import json
import os
import subprocess
import threading
import uuid

import pytest

from daemons import LiveCluster, wait_for


def mount_tmpfs(path, size: str) -> None:
    path.mkdir(parents=True, exist_ok=True)
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)],
                          capture_output=True, text=True)
    if done.returncode != 0:
        pytest.skip(f"a small filesystem to fill needs mount (root): {done.stderr.strip()}")


def fill(path) -> None:
    """Write a file until the filesystem is full."""
    fd = os.open(path / "filler", os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        for size in (1 << 20, 4096):
            try:
                while True:
                    os.write(fd, b"\0" * size)
            except OSError:
                pass
    finally:
        os.close(fd)


@pytest.fixture
def full_disk_cluster(tmp_path):
    live = LiveCluster(tmp_path)
    mount_tmpfs(live.state_dir, "4m")
    try:
        live.start_controller()
        live.start_node("n1", gpus=2)
        yield live
    finally:
        live.close()
        subprocess.run(["umount", str(live.state_dir)], check=False)


def job(cluster: LiveCluster, tag: str, **extra) -> dict:
    marker = cluster.workdir / f"ran-{tag}"
    return {"project": "alpha", "workdir": str(cluster.workdir), "command": ["touch", str(marker)],
            "cpus": 0.1, "memory_gib": 0.1, **extra}


def all_ids(cluster: LiveCluster) -> set[str]:
    status, active = cluster.api("GET", "/api/v1/jobs?all=1")
    assert status == 200, active
    status, ended = cluster.api("GET", "/api/v1/history?limit=10000")
    assert status == 200, ended
    return {j["id"] for j in active["jobs"]} | {j["id"] for j in ended["jobs"]}


def test_a_submit_the_store_refuses_is_503_and_never_exists_or_runs(full_disk_cluster):
    cluster = full_disk_cluster
    first = cluster.submit(**job(cluster, "first"))
    cluster.wait_state(first, "COMPLETED")
    fill(cluster.state_dir)
    refused: list[dict] = []
    accepted: list[str] = []
    for n in range(200):
        body = job(cluster, f"r{n}", **({"hold": True} if n % 2 else {}))
        if n % 3 == 0:
            body["array"] = "0-3"
        status, answer = cluster.api("POST", "/api/v1/jobs", body)
        if status == 201:
            accepted.extend(answer["ids"])
            continue
        assert status == 503, (status, answer)
        assert answer["error"].startswith("the state store refused the write: ") and "full" in answer["error"]
        refused.append(body)
        if len(refused) >= 10:
            break
    assert len(refused) >= 10, "the filled filesystem never refused a write"
    assert cluster.api("GET", "/healthz", token=None)[0] == 200
    known = all_ids(cluster)
    assert set(accepted) <= known
    status, queue = cluster.api("GET", "/api/v1/jobs?all=1")
    assert {j["id"] for j in queue["jobs"]} <= set(accepted) | {first}, "a refused job is in the queue"

    os.unlink(cluster.state_dir / "filler")
    last = cluster.submit(**job(cluster, "last"))
    cluster.wait_state(last, "COMPLETED")
    for body in refused:
        marker = body["command"][1]
        assert not os.path.exists(marker), f"a refused job ran: {body}"
    cluster.controller.stop()
    cluster.start_controller()
    after = all_ids(cluster)
    assert after == known | {last}, "a refused job came back after the restart"
    assert cluster.submit(**job(cluster, "next", hold=True))


@pytest.fixture
def cluster(live_cluster):
    return live_cluster()


def test_a_token_the_store_cannot_hold_is_400_and_spoils_no_concurrent_submit(cluster):
    results: list[tuple[int, object]] = []
    raw = json.dumps({"user": "x\ud800"}).encode()  # as a client may send it: a lone surrogate escape

    def submits() -> None:
        for n in range(40):
            results.append(cluster.api("POST", "/api/v1/jobs", job(cluster, f"s{n}", hold=True)))

    threads = [threading.Thread(target=submits) for _ in range(4)]
    for thread in threads:
        thread.start()
    bad = [cluster.api("POST", "/api/v1/tokens", raw=raw) for _ in range(20)]
    for thread in threads:
        thread.join()
    assert all(status == 400 and "user" in body["error"] for status, body in bad), bad[0]
    assert [status for status, _ in results] == [201] * 160, [r for r in results if r[0] != 201][:3]
    assert len({tuple(b["ids"]) for _, b in results}) == 160


def test_the_same_idempotency_key_gives_the_first_answer_and_one_job(cluster):
    key = str(uuid.uuid4())
    body = job(cluster, "once", hold=True, array="0-2")
    answers = [cluster.api_with_headers("POST", "/api/v1/jobs", body, {"Idempotency-Key": key})
               for _ in range(3)]
    assert [status for status, _, _ in answers] == [201] * 3
    assert answers[0][1] == answers[1][1] == answers[2][1] and answers[0][1]["array_id"]
    assert answers[0][2].get("Idempotent-Replayed") is None and answers[1][2]["Idempotent-Replayed"] == "true"
    status, queue = cluster.api("GET", "/api/v1/jobs")
    assert sorted(j["id"] for j in queue["jobs"]) == sorted(answers[0][1]["ids"])

    status, reused, _ = cluster.api_with_headers("POST", "/api/v1/jobs", {**body, "name": "other"},
                                                 {"Idempotency-Key": key})
    assert status == 422 and reused["field"] == "Idempotency-Key", reused
    bob = cluster.token_for("bob")
    status, other_user, _ = cluster.api_with_headers("POST", "/api/v1/jobs", body, {"Idempotency-Key": key},
                                                     token=bob)
    assert status == 201 and other_user["ids"] != answers[0][1]["ids"], "keys belong to their user"
    status, bad, _ = cluster.api_with_headers("POST", "/api/v1/jobs", body, {"Idempotency-Key": "a\tb"})
    assert status == 400 and bad["field"] == "Idempotency-Key"

    cluster.controller.stop()
    cluster.start_controller()
    status, again, headers = cluster.api_with_headers("POST", "/api/v1/jobs", body, {"Idempotency-Key": key})
    assert (status, again, headers["Idempotent-Replayed"]) == (201, answers[0][1], "true")


def test_concurrent_retries_with_one_key_make_one_batch(cluster):
    key = str(uuid.uuid4())
    body = {"jobs": [job(cluster, f"b{n}", hold=True) for n in range(50)]}
    answers: list = []

    def send() -> None:
        answers.append(cluster.api_with_headers("POST", "/api/v1/jobs/batch", body, {"Idempotency-Key": key}))

    threads = [threading.Thread(target=send) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert {status for status, _, _ in answers} == {201}
    assert len({tuple(a["ids"]) for _, a, _ in answers}) == 1
    status, queue = cluster.api("GET", "/api/v1/jobs")
    assert len(queue["jobs"]) == 50
    wait_for(lambda: cluster.controller.alive(), "the controller")
