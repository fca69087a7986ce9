"""Clients that retry with an Idempotency-Key lose nothing and duplicate nothing when the controller is killed."""

from __future__ import annotations

import collections
import signal
import threading
import time

from daemons import LiveCluster, wait_for
from gpud.client import Client, Unreachable

JOBS = 300
KILL_AT = (40, 120, 200)


def test_kill_9_during_submits_with_retries_loses_and_duplicates_nothing(tmp_path):
    cluster = LiveCluster(tmp_path)
    try:
        cluster.start_controller()
        token = cluster.admin_token
        told: dict[str, list[str]] = {}
        lock = threading.Lock()
        names = iter(range(JOBS))
        failures: list[BaseException] = []

        def worker() -> None:
            client = Client(cluster.url, token, timeout=10.0, retry_s=120.0)
            try:
                while True:
                    with lock:
                        index = next(names, None)
                    if index is None:
                        return
                    body = {"project": "alpha", "workdir": str(cluster.workdir), "command": ["true"],
                            "hold": True, "name": f"j{index}"}
                    while True:
                        try:
                            answer = client.post("jobs", body, idempotent=True)
                            break
                        except Unreachable as exc:  # down before anything was sent: nothing to repeat
                            if not exc.refused:
                                raise
                            time.sleep(0.05)
                    with lock:
                        told[f"j{index}"] = answer["ids"]
            except BaseException as exc:  # noqa: BLE001 - reported by the test thread
                failures.append(exc)

        threads = [threading.Thread(target=worker) for _ in range(8)]
        for thread in threads:
            thread.start()
        for mark in KILL_AT:
            wait_for(lambda: len(told) >= mark or not any(t.is_alive() for t in threads), f"{mark} submits",
                     timeout=120)
            cluster.controller.stop(signal.SIGKILL)
            cluster.start_controller()
        for thread in threads:
            thread.join(180)
        assert not failures, failures[0]
        assert len(told) == JOBS
        status, queue = cluster.api("GET", "/api/v1/jobs")
        assert status == 200
        names_seen = collections.Counter(job["name"] for job in queue["jobs"])
        ids = {job["id"] for job in queue["jobs"]}
        lost = [name for name, got in told.items() if not set(got) <= ids]
        duplicated = {name: count for name, count in names_seen.items() if count > 1}
        assert (lost, duplicated) == ([], {})
        assert set(names_seen) == set(told), "a job nobody was told of"
    finally:
        cluster.close()
