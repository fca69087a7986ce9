"""Reservations on a real cluster: a gang behind a job near its time limit keeps its place.

One node of 8 fake GPUs: a job holds 4 of them for a 12 s limit; an 8-GPU gang
is submitted, then 1-GPU jobs with 5-minute limits, then one with a 4 s limit.
The gang is told it starts when the running job's limit ends, no 5-minute job
starts before it, the 4 s job starts at once beside the reservation, and the
gang starts when the GPUs free.
"""

from __future__ import annotations

import pytest

from daemons import wait_for

POLICY = """\
grace_period = 1
min_runtime = 0

[[projects]]
name = "alpha"
"""
LIMIT_S = 12.0
RESOLUTION_S = 300.0  # the policy's default [reservations] resolution


@pytest.fixture
def cluster(live_cluster):
    return live_cluster(POLICY, nodes={"n1": 8})


def test_a_gang_holds_its_start_and_a_short_job_backfills(cluster):
    holder = cluster.submit(gpus=4, time_limit_s=LIMIT_S, command=["sleep", "1000"])
    running = cluster.wait_state(holder, "RUNNING")
    gang = cluster.submit(gpus=8, time_limit_s=60, command=["sleep", "2"])
    small = [cluster.submit(gpus=1, time_limit_s=300, command=["sleep", "1000"]) for _ in range(3)]

    def planned():
        job = cluster.job(gang)
        return job if job.get("reserved_start") is not None else None
    planned_gang = wait_for(planned, "the gang to hold a reservation")
    assert planned_gang["state"] == "PENDING"
    # The scheduler counts the limit from the cycle that started the job, a moment before the node said so.
    # The gang may start then; it is promised the end of that 5-minute resolution step at the latest.
    limit_end = running["started"] + LIMIT_S
    assert planned_gang["estimated_start"] == pytest.approx(limit_end, abs=1.0)
    assert planned_gang["reserved_start"] % RESOLUTION_S == 0
    assert limit_end - 1.0 <= planned_gang["reserved_start"] < limit_end + RESOLUTION_S
    assert planned_gang["start_nodes"] == ["n1"]
    status, why = cluster.api("GET", f"/api/v1/jobs/{gang}/why")
    assert status == 200 and why["start"]["reserved_start"] == planned_gang["reserved_start"]

    short = cluster.submit(gpus=1, time_limit_s=4, command=["sleep", "1"])
    cluster.wait_state(short, "RUNNING", "COMPLETED")
    assert cluster.job(holder)["state"] == "RUNNING", "the short job started only because the holder ended"
    for job_id in small:
        job = cluster.job(job_id)
        assert job["state"] == "PENDING", (job_id, job["reason"])
        assert job["estimated_start"] is None or job["estimated_start"] >= planned_gang["estimated_start"]

    started_gang = cluster.wait_state(gang, "RUNNING", "COMPLETED", timeout=LIMIT_S + 30)
    assert planned_gang["estimated_start"] - 1.0 <= started_gang["started"] <= planned_gang["reserved_start"]
    for job_id in small:
        job = cluster.wait_state(job_id, "RUNNING", timeout=30)
        assert job["started"] >= started_gang["started"], f"{job_id} started before the gang"


def test_estimates_use_the_run_times_of_the_users_last_jobs_of_the_shape(cluster):
    # A 4-GPU job of this user ran about a second; the next, of a 60 s limit, is expected to end as soon:
    # the gang behind it is told it may start long before the limit ends, which its reservation keeps.
    first = cluster.submit(gpus=4, time_limit_s=60, command=["sleep", "1"])
    cluster.wait_state(first, "COMPLETED")
    holder = cluster.submit(gpus=4, time_limit_s=60, command=["sleep", "1000"])
    running = cluster.wait_state(holder, "RUNNING")
    gang = cluster.submit(gpus=8, time_limit_s=60, command=["sleep", "2"])

    def planned():
        job = cluster.job(gang)
        return job if job.get("reserved_start") is not None else None
    planned_gang = wait_for(planned, "the gang to hold a reservation")
    assert running["started"] + 59.0 <= planned_gang["reserved_start"] < running["started"] + 60 + RESOLUTION_S
    assert planned_gang["estimated_start"] < running["started"] + 60 - 30
