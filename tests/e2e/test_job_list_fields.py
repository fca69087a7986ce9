"""A job listing asked for some fields carries only those, hides what it hid before, and gpuctl queue's
table, read from such a listing, is the table the whole job objects give.

A real controller on 127.0.0.1 with one node: a running job, pending ones (an array among them) of two
users, so that another user's confidential fields and a pending job's expected start are in the listing.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from daemons import LiveCluster, running_cluster, wait_for
from gpud.cli import queue_cmd
from gpud.controller.views import JOB_VIEW_FIELDS


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    with running_cluster(tmp_path_factory.mktemp("fields"), nodes={"n1": 1}) as live:
        bob = live.token_for("bob")
        running = live.submit(command=["sleep", "600"], gpus=1, name="long-running")
        live.wait_state(running, "RUNNING")
        live.submit(command=["true"], gpus=1, name="waits-for-the-gpu")
        live.submit(token=bob, command=["true"], gpus=1, name="bobs", env={"SECRET": "x"})
        status, answer = live.api("POST", "/api/v1/jobs", {"project": "alpha", "workdir": str(live.workdir),
                                                           "command": ["true"], "gpus": 1, "array": "0-5"})
        assert status == 201, answer
        live.bob = bob
        yield live


def listing(cluster: LiveCluster, query: str = "", token: str | None = "admin") -> dict:
    status, answer = cluster.api("GET", f"/api/v1/jobs?{query}", token=token)
    assert status == 200, answer
    return answer


def test_every_field_a_listed_job_has_is_a_known_field(cluster):
    wait_for(lambda: any("estimated_start" in job for job in listing(cluster)["jobs"]), "a pending job's start")
    seen = set()
    for token in ("admin", cluster.bob):  # bob sees the others' jobs without their confidential fields
        for job in listing(cluster, "all=1", token)["jobs"]:
            seen |= set(job)
    assert seen <= JOB_VIEW_FIELDS, seen - JOB_VIEW_FIELDS
    assert {"confidential", "estimated_start", "command"} <= seen


def test_a_listing_with_fields_carries_only_those_and_hides_what_it_hid(cluster):
    whole = listing(cluster, token=cluster.bob)
    some = listing(cluster, "fields=id,command,estimated_start,array_id", token=cluster.bob)
    assert some["arrays"] == whole["arrays"] and some["next_cursor"] == whole["next_cursor"]
    assert [job["id"] for job in some["jobs"]] == [job["id"] for job in whole["jobs"]]
    for full, part in zip(whole["jobs"], some["jobs"]):
        assert part == {key: full[key] for key in ("id", "command", "estimated_start", "array_id") if key in full}
    shown = {job["id"]: job for job in some["jobs"]}
    theirs = [job for job in whole["jobs"] if job.get("confidential")]
    assert theirs and all("command" not in shown[job["id"]] for job in theirs)   # still not bob's to see
    assert any(shown[job["id"]].get("command") == ["true"] for job in whole["jobs"] if job["user"] == "bob")


@pytest.mark.parametrize("query, words", [
    ("fields=id,nmae", "unknown job field 'nmae' in fields"), ("fields=,", "fields must name at least one"),
])
def test_a_bad_fields_list_is_refused_naming_it(cluster, query, words):
    status, answer = cluster.api("GET", f"/api/v1/jobs?{query}")
    assert status == 422 and words in answer["error"] and answer["field"] == "fields", (status, answer)


@pytest.mark.parametrize("start", [False, True], ids=["queue", "queue --start"])
def test_gpuctl_queue_prints_from_its_fields_the_table_of_the_whole_jobs(cluster, start):
    env = {**os.environ, "GPUD_URL": cluster.url, "GPUD_TOKEN": cluster.admin_token, "GPUD_RETRY": "0",
           "XDG_CONFIG_HOME": str(cluster.root / "no-config")}
    shown = subprocess.run([sys.executable, "-m", "gpud.cli.gpuctl", "queue", *(["--start"] if start else [])],
                           env=env, capture_output=True, text=True, timeout=120)
    assert shown.returncode == 0, shown.stderr
    whole = listing(cluster, "limit=5000")
    now = time.time()
    if start:
        expected = queue_cmd.start_table([j for j in whole["jobs"] if j.get("state") == "PENDING"], now)
    else:
        expected = queue_cmd.queue_table(queue_cmd.collapse_arrays(whole["jobs"], whole["arrays"], now), now)
    # The running job's TIME moves between the two reads: compare it by shape, every other cell exactly.
    assert _without_times(shown.stdout.rstrip("\n")) == _without_times(expected)
    assert "waits-for-the-gpu" in shown.stdout and ("long-running" in shown.stdout) != start


def _without_times(table: str) -> list[list[str]]:
    """The table's words, each duration (``1:02``, ``1:02:03``) as H:MM, whatever the columns' widths."""
    return [[("H:MM" if ":" in word and word.replace(":", "").isdigit() else word) for word in line.split()]
            for line in table.splitlines()]
