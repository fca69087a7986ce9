"""The job list is paged: a default limit, a cursor that continues it, and gpuctl queue follows the cursor.

A real controller on 127.0.0.1 with a few thousand held jobs (an array and
single jobs). Every job is listed exactly once across the pages, in the
listing order, and a job submitted between two pages is on a later one.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from daemons import LiveCluster, running_cluster

ELEMENTS = 2500


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    with running_cluster(tmp_path_factory.mktemp("pages")) as live:
        live.submit(command=["true"], hold=True, name="first")
        status, answer = live.api("POST", "/api/v1/jobs", {"project": "alpha", "workdir": str(live.workdir),
                                                           "command": ["true"], "hold": True,
                                                           "array": f"0-{ELEMENTS - 1}"})
        assert status == 201, answer
        live.submit(command=["true"], hold=True, name="last")
        yield live


def pages(cluster: LiveCluster, query: str = "") -> list[dict]:
    """Every page of GET /api/v1/jobs, following next_cursor."""
    got = []
    cursor = None
    while True:
        path = "/api/v1/jobs?" + query + (f"&cursor={cursor}" if cursor else "")
        status, answer = cluster.api("GET", path)
        assert status == 200, answer
        got.append(answer)
        cursor = answer["next_cursor"]
        if cursor is None:
            return got


def order(job: dict) -> tuple:
    return (job["submitted"], job["array_index"] if job["array_index"] is not None else -1, job["id"])


def test_the_list_has_a_default_limit_and_a_cursor(cluster):
    status, answer = cluster.api("GET", "/api/v1/jobs")
    assert status == 200
    assert len(answer["jobs"]) == 1000 and answer["next_cursor"]
    assert answer["jobs"][0]["name"] == "first"


@pytest.mark.parametrize("limit", [1, 700, 10_000])
def test_the_pages_hold_every_job_once_in_order(cluster, limit):
    if limit == 1:
        got = [cluster.api("GET", "/api/v1/jobs?limit=1")[1]]
        assert len(got[0]["jobs"]) == 1 and got[0]["next_cursor"]
        return
    listed = [job for page in pages(cluster, f"limit={limit}") for job in page["jobs"]]
    assert len(listed) == ELEMENTS + 2
    assert len({job["id"] for job in listed}) == ELEMENTS + 2
    assert listed == sorted(listed, key=order)
    assert listed[0]["name"] == "first" and listed[-1]["name"] == "last"


def test_a_job_submitted_between_pages_comes_on_a_later_page(cluster):
    status, first = cluster.api("GET", "/api/v1/jobs?limit=500")
    late = cluster.submit(command=["true"], hold=True, name="late")
    try:
        cursor, ids = first["next_cursor"], []
        while cursor:
            status, page = cluster.api("GET", f"/api/v1/jobs?limit=2000&cursor={cursor}")
            ids += [job["id"] for job in page["jobs"]]
            cursor = page["next_cursor"]
        assert ids[-1] == late and len(ids) == ELEMENTS + 3 - 500
    finally:
        cluster.api("POST", f"/api/v1/jobs/{late}/cancel")


@pytest.mark.parametrize("query, status, words", [
    ("limit=0", 422, "limit must be 1 to 10000"), ("limit=10001", 422, "limit must be 1 to 10000"),
    ("limit=many", 400, "limit must be an integer"), ("cursor=nonsense", 400, "cursor is not one"),
    ("cursor=WzEsMiwzXQ", 400, "cursor is not one"),   # [1,2,3]: the right shape, a wrong id type
])
def test_a_bad_limit_or_cursor_is_refused_naming_it(cluster, query, status, words):
    got, answer = cluster.api("GET", f"/api/v1/jobs?{query}")
    assert got == status and words in answer["error"], (got, answer)


def test_gpuctl_queue_follows_the_cursor_to_the_end(cluster):
    env = {**os.environ, "GPUD_URL": cluster.url, "GPUD_TOKEN": cluster.admin_token, "GPUD_RETRY": "0",
           "XDG_CONFIG_HOME": str(cluster.root / "no-config")}
    result = subprocess.run([sys.executable, "-m", "gpud.cli.gpuctl", "queue", "--array", "--json"], env=env,
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    answer = json.loads(result.stdout)
    assert len(answer["jobs"]) == ELEMENTS + 2 and answer["next_cursor"] is None
    table = subprocess.run([sys.executable, "-m", "gpud.cli.gpuctl", "queue"], env=env, capture_output=True,
                           text=True, timeout=120)
    assert table.returncode == 0, table.stderr
    assert f"_[0-{ELEMENTS - 1}]" in table.stdout   # the whole array on one row, from every page
