"""``gpuctl usage`` and ``gpuctl report`` against a real controller and node, with GPU load the fake backend
reports for a job's process."""

from __future__ import annotations

import csv
import io
import json
import os
import subprocess
import sys
import time

import pytest

from daemons import POLICY, LiveCluster, wait_for
from gpud.gpu.fake import set_process_usage

USAGE_POLICY = "usage_charge_interval = 0.5\n" + POLICY


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    live = LiveCluster(tmp_path_factory.mktemp("usage-report"), policy=USAGE_POLICY, heartbeat_s=0.2)
    try:
        live.start_controller()
        # The fake GPUs report exactly the usage the tests set, not what they would measure of the job's processes.
        before = os.environ.get("GPUD_FAKE_GPU_SIMULATE")
        os.environ["GPUD_FAKE_GPU_SIMULATE"] = "0"
        try:
            live.start_node("n1", gpus=4)
        finally:
            if before is None:
                del os.environ["GPUD_FAKE_GPU_SIMULATE"]
            else:
                os.environ["GPUD_FAKE_GPU_SIMULATE"] = before
        yield live
    finally:
        live.close()


def gpuctl(cluster: LiveCluster, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "GPUD_URL": cluster.url, "GPUD_TOKEN": cluster.admin_token, "GPUD_TIMEOUT": "10",
           "XDG_CONFIG_HOME": str(cluster.root / "no-config")}
    return subprocess.run([sys.executable, "-m", "gpud.cli.gpuctl", *args], env=env, capture_output=True, text=True,
                          timeout=60)


@pytest.fixture(scope="module")
def loaded_job(cluster):
    """A 2-GPU job whose process the fake GPUs show at 60% and 80% busy, holding 10 and 30 GiB."""
    pid_file = cluster.workdir / "pid"
    release = cluster.workdir / "release"
    job = cluster.submit(command=["sh", "-c", f"echo $$ > {pid_file}; while [ ! -e {release} ]; do sleep 0.05; "
                                              f"done"], gpus=2, project="beta")
    cluster.wait_state(job, "RUNNING")
    pid = int(wait_for(lambda: pid_file.exists() and pid_file.read_text().strip(), "the job's pid"))
    gpus = cluster.job(job)["placements"][0]["gpus"]
    for gpu, (memory, util) in zip(gpus, [(10.0, 60.0), (30.0, 80.0)]):
        set_process_usage(str(cluster.root / "n1"), pid, gpu, memory, util)
    time.sleep(1.5)  # several heartbeats carry samples
    release.touch()
    cluster.wait_state(job, "COMPLETED")
    return job


def test_report_gives_gpu_hours_waits_and_the_gpu_efficiency_the_node_sampled(cluster, loaded_job):
    result = gpuctl(cluster, "report", "--by", "project", "--since", "1h", "--json")
    assert result.returncode == 0, result.stderr
    rows = {row["project"]: row for row in json.loads(result.stdout)["rows"]}
    beta = rows["beta"]
    assert beta["jobs"] == 1
    assert beta["gpu_hours"] * 3600 == pytest.approx(cluster.job(loaded_job)["gpu_hours"] * 3600, abs=0.01)
    assert beta["gpu_utilization"] == pytest.approx(70.0, abs=0.5)      # the mean of 60% and 80%
    assert beta["gpu_memory_peak_gib"] == pytest.approx(30.0)           # the most on one GPU
    assert 0 <= beta["mean_wait_s"] <= beta["p95_wait_s"] < 10
    table = gpuctl(cluster, "report", "--by", "project", "--since", "1h")
    assert "beta" in table.stdout and "70%" in table.stdout and "30.0 GiB" in table.stdout
    lines = list(csv.reader(io.StringIO(gpuctl(cluster, "report", "--by", "department", "--csv").stdout)))
    assert lines[0][:3] == ["department", "gpu_hours", "cpu_hours"]
    assert [line[0] for line in lines[1:]] == ["research"]


def test_a_window_that_ended_before_the_job_leaves_it_out(cluster, loaded_job):
    result = gpuctl(cluster, "report", "--since", "2026-01-01", "--until", "2026-01-02", "--json")
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["rows"] == []


def test_bad_windows_and_groupings_are_refused_with_what_is_wrong(cluster):
    result = gpuctl(cluster, "report", "--by", "team")
    assert result.returncode == 2 and "cannot group by 'team'" in result.stderr and "department" in result.stderr
    result = gpuctl(cluster, "report", "--since", "2026-02-30")
    assert result.returncode == 2 and "bad date '2026-02-30'" in result.stderr
    result = gpuctl(cluster, "report", "--since", "2026-11-05", "--until", "2026-11-01")
    assert result.returncode == 2 and "--until must be after --since" in result.stderr
    status, body = cluster.api("GET", "/api/v1/report?by=team")
    assert status == 422 and "by must be one of" in body["error"]
    status, body = cluster.api("GET", "/api/v1/report?since=yesterday")
    assert status == 400 and "Unix times" in body["error"]


def test_usage_shows_quota_fair_share_usage_and_standing(cluster, loaded_job):
    result = gpuctl(cluster, "usage", "--json")
    assert result.returncode == 0, result.stderr
    rows = {(r["level"], r["name"]): r for r in json.loads(result.stdout)["rows"]}
    beta = rows[("project", "beta")]
    assert beta["quota"] == 2 and beta["fair_share"] is not None
    assert beta["gpu_hours"] > 0 and beta["usage_share"] > 0
    assert beta["standing"] == pytest.approx(beta["entitlement_share"] / beta["usage_share"])
    table = gpuctl(cluster, "usage", "-p", "beta").stdout
    assert "STANDING" in table and "beta" in table and "alpha" not in table and "research" in table
    result = gpuctl(cluster, "usage", "-p", "gamma")
    assert result.returncode != 0 and "no project 'gamma'" in result.stderr and "alpha, beta" in result.stderr
    result = gpuctl(cluster, "usage", "--pool", "h200")
    assert result.returncode != 0 and "no node pool 'h200'" in result.stderr
