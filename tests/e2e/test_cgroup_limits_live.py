"""The node's cgroup limits as a user meets them, through a real controller and node daemons.

The limits themselves are tested on the node's parts (tests/node/test_cgroups.py,
tests/node/test_pids_limit.py); here a job submitted over the API is held to
them, and what it used and what held it show in its record.
"""

from __future__ import annotations

import os
import sys

import pytest

from daemons import POLICY, LiveCluster
from gpud.cli.job_cmd import show_text
from gpud.cli.nodes_cmd import nodes_text
from gpud.node import cgroups
from test_pids_limit import FORKER, needs_pids

HOST = cgroups.detect()
pytestmark = pytest.mark.skipif(not HOST.tracked(), reason="this host lets us make no cgroup (not root, or none "
                                                           "writable)")
MIB = 1 << 20


def test_a_job_over_its_mem_fails_out_of_memory_and_shows_what_it_used(tmp_path, monkeypatch):
    cluster = LiveCluster(tmp_path)
    try:
        cluster.start_controller()
        cluster.start_node("n1", gpus=1, labels={"kind": "cgroups"})
        monkeypatch.setenv(cgroups.CGROUPS_ENV, "off")
        cluster.start_node("bare", gpus=1, labels={"kind": "bare"})
        hog = ("import time\nx = 0\nfor i in range(2_000_000): x += i\n"
               "b = bytearray(800 * 2**20)\nfor i in range(0, len(b), 4096): b[i] = 1\n")
        job_id = cluster.submit(command=[sys.executable, "-c", hog], gpus=1, cpus=1, memory_gib=200 / 1024,
                                constraint={"kind": "cgroups"})
        job = cluster.wait_state(job_id, "FAILED", "COMPLETED", timeout=60)
        assert (job["state"], job["reason"]) == ("FAILED", "task 0 out of memory (limit 200M)")
        assert 150 * MIB < job["max_rss_bytes"] <= 200 * MIB and job["cpu_s"] > 0.05
        text = show_text(job, job["ended"])
        assert "MaxRSS:" in text and "TotalCPU:" in text and "Limits:      memory, cpu" in text, text
        if os.access("/sys/fs/cgroup/pids/cgroup.procs", os.W_OK):  # a v1 pids hierarchy: the task is counted
            assert "pids" in text.split("Limits:")[1].splitlines()[0], text
        # The node without cgroups says so, and so does a job that runs there.
        nodes = {n["name"]: n for n in cluster.api("GET", "/api/v1/nodes")[1]["nodes"]}
        assert nodes["bare"]["limits"]["enforced"] == []
        assert set(nodes["n1"]["limits"]["enforced"]) == set(HOST.enforced())
        table = nodes_text(list(nodes.values()), 0).splitlines()
        assert [line for line in table if "limits: not enforced" in line][0].startswith("bare")
        free = cluster.submit(command=["sleep", "60"], gpus=1, constraint={"kind": "bare"})
        running_job = cluster.wait_state(free, "RUNNING")
        assert "Limits:      not enforced" in show_text(running_job, running_job["started"])
    finally:
        cluster.close()


@needs_pids
def test_a_job_forking_past_the_policys_pids_limit_is_refused(tmp_path):
    cluster = LiveCluster(tmp_path, policy="task_pids_max = 50\n" + POLICY)
    try:
        cluster.start_controller()
        cluster.start_node("n1", gpus=1)
        job_id = cluster.submit(command=[sys.executable, "-c", FORKER], gpus=0, cpus=1,
                                output="forker.out")
        job = cluster.wait_state(job_id, "COMPLETED", "FAILED", timeout=60)
        assert job["state"] == "COMPLETED", job
        started, refused, written = (cluster.workdir / "forker.out").read_text().split()
        assert refused == "True" and int(started) < 50 and int(written) == 50, (started, refused, written)
    finally:
        cluster.close()
