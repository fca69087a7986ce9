"""A fleet registering node by node: a real controller, 200 emulated nodes (gpud.testing.fleet, the real node
protocol) connecting over two seconds.

Each node that registers changes what the scheduler is built from, and a
build costs what the whole cluster is. The controller builds it anew at most
once every MIN_BUILD_GAP_S (its /metrics count the builds), not once per
cycle, and every node is scheduled on once the fleet is up.
"""

from __future__ import annotations

import time

import pytest

from daemons import LiveCluster, wait_for
from gpud.controller.service import MIN_BUILD_GAP_S

NODES, GPUS = 200, 2
RAMP_S = 2.0
POLICY = f"""\
min_runtime = 0

[[projects]]
name = "fleet"
gpu_quota = {NODES * GPUS}
"""
TIMEOUT_S = 120.0


@pytest.fixture
def live(tmp_path):
    cluster = LiveCluster(tmp_path, policy=POLICY, node_timeout_s=60.0, heartbeat_s=1.0)
    try:
        cluster.start_controller()
        cluster.start_emulator(NODES, GPUS, RAMP_S)
        yield cluster
    finally:
        cluster.close()


def _builds(live: LiveCluster) -> int:
    status, text = live.api("GET", "/metrics", token=None)
    assert status == 200, (status, text)
    for line in text.splitlines():
        if line.startswith("gpud_scheduler_builds_total "):
            return int(float(line.split()[1]))
    raise AssertionError("/metrics has no gpud_scheduler_builds_total")


def test_a_fleet_registering_node_by_node_is_built_anew_a_few_times_a_second(live):
    began = time.monotonic()
    before = _builds(live)
    wait_for(lambda: live.nodes_up() == NODES, f"{NODES} emulated nodes to register\n{live.emulator_output()}",
             TIMEOUT_S)
    registering_s = time.monotonic() - began
    # The emulator submits nothing: every build since is for nodes that registered, at most one per gap (and
    # the one a registration may start right away, after a quiet spell). Once per cycle, it was every 10 ms.
    built = _builds(live) - before
    assert 1 <= built <= registering_s / MIN_BUILD_GAP_S + 2, (built, registering_s)

    # Every node is scheduled on: a one-GPU job fills each GPU of the fleet.
    status, body = live.api("POST", "/api/v1/jobs/batch", {"jobs": [
        {"project": "fleet", "gpus": 1, "cpus": 1, "memory_gib": 1, "command": ["sleep", "3600"],
         "workdir": str(live.workdir)} for _ in range(NODES * GPUS)]})
    assert status == 201, (status, body)
    wait_for(lambda: _every_gpu_used(live), "every GPU of the fleet to run a job", TIMEOUT_S)


def _every_gpu_used(live: LiveCluster) -> bool:
    _, body = live.api("GET", "/api/v1/nodes")
    return [node["gpus_used"] for node in body["nodes"]] == [GPUS] * NODES
