"""A real controller and 30 emulated nodes (gpud.testing.fleet, its own process, the real node protocol).

The fleet fills: one-GPU jobs take every GPU and the next one waits. A
cancel stops them through the nodes, and a mix of one-GPU jobs, fractions
and gangs, each running the time its job gives it, drains to COMPLETED
(a job told to exit with code 3 ends FAILED with it). Throughout, no node
is marked down, none reconnects, no lease runs out and the controller
refuses no message.
"""

from __future__ import annotations

import json
import os
import signal

import pytest

from daemons import LiveCluster, wait_for
from gpud.testing.fleet import run_seconds

NODES, GPUS = 30, 4
CAPACITY = NODES * GPUS
POLICY = f"""\
grace_period = 2
min_runtime = 0

[[projects]]
name = "fleet"
gpu_quota = {CAPACITY}
"""
TIMEOUT_S = 120.0


@pytest.fixture
def fleet(tmp_path):
    live = LiveCluster(tmp_path, policy=POLICY, node_timeout_s=30.0, heartbeat_s=0.5)
    live.status_file, live.report_file = tmp_path / "fleet.status.json", tmp_path / "fleet.report.json"
    try:
        live.start_controller()
        live.start_emulator(NODES, GPUS, 0.5, "--status", str(live.status_file), "--report", str(live.report_file))
        wait_for(lambda: live.nodes_up() == NODES, f"{NODES} emulated nodes to register\n{live.emulator_output()}",
                 TIMEOUT_S)
        yield live
    finally:
        live.close()


def _status(live: LiveCluster) -> dict:
    try:
        return json.loads(live.status_file.read_text())
    except (OSError, ValueError):
        return {}


def _submit(live: LiveCluster, jobs: list[dict]) -> list[str]:
    for job in jobs:
        job.setdefault("project", "fleet")
        job.setdefault("workdir", str(live.workdir))
        job.setdefault("cpus", 1)
        job.setdefault("memory_gib", 1)
    status, body = live.api("POST", "/api/v1/jobs/batch", {"jobs": jobs})
    assert status == 201, (status, body)
    return body["ids"]


def _states(live: LiveCluster, ids: list[str]) -> dict[str, dict]:
    wanted = set(ids)
    status, body = live.api("GET", "/api/v1/jobs?all=1&limit=5000")
    assert status == 200, (status, body)
    return {job["id"]: job for job in body["jobs"] if job["id"] in wanted}


def _all_in(live: LiveCluster, ids: list[str], states: set[str]) -> bool:
    found = _states(live, ids)
    return len(found) == len(ids) and all(job["state"] in states for job in found.values())


def test_the_fleet_fills_stops_and_drains_with_no_node_lost(fleet):
    live = fleet
    # Fill: a one-GPU job on every GPU, and one more that must wait.
    filling = _submit(live, [{"gpus": 1, "command": ["sleep", "3600"]} for _ in range(CAPACITY)])
    wait_for(lambda: _status(live).get("running") == CAPACITY, "every GPU to run a task", TIMEOUT_S)
    wait_for(lambda: _all_in(live, filling, {"RUNNING"}), "every filling job to be RUNNING", TIMEOUT_S)
    _, body = live.api("GET", "/api/v1/nodes")
    assert [node["gpus_used"] for node in body["nodes"]] == [GPUS] * NODES
    extra = _submit(live, [{"gpus": 1, "command": ["sleep", "0"]}])
    assert live.job(extra[0])["state"] == "PENDING"

    # Stop: cancelling reaches the nodes, which report the tasks gone; the waiting job then runs and ends.
    for job_id in filling:
        status, body = live.api("POST", f"/api/v1/jobs/{job_id}/cancel")
        assert status == 200, (status, body)
    wait_for(lambda: _all_in(live, filling, {"CANCELLED"}), "the filling jobs to be CANCELLED", TIMEOUT_S)
    wait_for(lambda: _status(live).get("stopped") == CAPACITY, "the nodes to stop every task", TIMEOUT_S)
    live.wait_state(extra[0], "COMPLETED", timeout=TIMEOUT_S)

    # Drain: twice the fleet's worth of short jobs of every shape, which end with the code they are given.
    mix = ([{"gpus": 1, "env": {"GPUD_EMULATED_RUN_S": "0.3"}} for _ in range(120)]
           + [{"gpus": 0.5, "env": {"GPUD_EMULATED_RUN_S": "0.2"}} for _ in range(80)]
           + [{"gpus": 2, "tasks": 2, "env": {"GPUD_EMULATED_RUN_S": "0.3"}} for _ in range(40)]
           + [{"gpus": 4, "tasks": 3, "command": ["sleep", "0.1"]} for _ in range(10)])
    for job in mix:
        job.setdefault("command", ["true"])
    draining = _submit(live, mix)
    failing = _submit(live, [{"gpus": 1, "command": ["true"], "env": {"GPUD_EMULATED_EXIT_CODE": "3"}}])
    wait_for(lambda: _all_in(live, draining, {"COMPLETED"}), "the mix to complete", TIMEOUT_S, interval=0.5)
    ended = _states(live, draining)
    assert {job["exit_code"] for job in ended.values()} == {0}
    failed = live.wait_state(failing[0], "FAILED", timeout=TIMEOUT_S)
    assert failed["exit_code"] == 3
    tasks = CAPACITY + 1 + 120 + 80 + 40 * 2 + 10 * 3 + 1
    counts = wait_for(lambda: (lambda now: now if now.get("running") == 0 else None)(_status(live)),
                      "every task to have ended on its node", TIMEOUT_S)
    # Every task started ended on its node; a few more than the jobs' tasks start when the scheduler moves
    # running jobs to make room for a gang (each move stops a task and starts it again elsewhere).
    assert counts["started"] >= tasks, counts
    assert counts["started"] == counts["ended"] + counts["stopped"], counts

    # No node went down or reconnected, no lease ran out, nothing was refused.
    assert live.nodes_up() == NODES
    os.kill(live.emulator.pid, signal.SIGTERM)
    assert live.emulator.wait(30) == 0
    report = json.loads(live.report_file.read_text())
    assert report["errors"] == 0, report["error_texts"]
    assert report["registrations"] == NODES
    assert report["lease_expiries"] == 0 and report["fenced"] == 0
    assert report["duplicate_starts"] == 0 and report["bad_orders"] == 0
    assert report["heartbeats"] > 0


def test_a_task_runs_the_time_its_job_gives_it():
    assert run_seconds({"env": {"GPUD_EMULATED_RUN_S": "2.5"}, "command": ["sleep", "9"]}) == 2.5
    assert run_seconds({"env": {}, "command": ["/bin/sleep", "9"]}) == 9.0
    assert run_seconds({"env": {}, "command": ["true"]}) == 0.0
    with pytest.raises(ValueError, match="GPUD_EMULATED_RUN_S"):
        run_seconds({"env": {"GPUD_EMULATED_RUN_S": "-1"}})
    with pytest.raises(ValueError):
        run_seconds({"command": ["sleep", "soon"]})
