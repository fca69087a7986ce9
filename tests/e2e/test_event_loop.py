"""The controller daemon runs on uvloop's event loop, or on asyncio's own when GPUD_EVENT_LOOP asks.

Real controller and node processes on 127.0.0.1: the loop each serves on is
read from its /metrics (gpud_event_loop_info), and a job runs end to end
over the nodes' WebSocket on it; an unknown GPUD_EVENT_LOOP is refused
before the controller makes or opens anything.
"""

from __future__ import annotations

import subprocess
import sys

import pytest

from daemons import LiveCluster


def served_loop(cluster: LiveCluster) -> str:
    """The loop the controller's /metrics says it runs on."""
    status, page = cluster.api("GET", "/metrics", token=None)
    assert status == 200, page
    found = [line for line in page.splitlines() if line.startswith("gpud_event_loop_info{")]
    assert len(found) == 1, page
    series, value = found[0].split(" ")
    assert value == "1"
    return series.split('"')[1]


@pytest.mark.parametrize("asked, runs", [(None, "uvloop"), ("asyncio", "asyncio")])
def test_a_job_runs_end_to_end_on_the_loop_asked_for(tmp_path, monkeypatch, asked, runs):
    if asked is None:
        monkeypatch.delenv("GPUD_EVENT_LOOP", raising=False)
    else:
        monkeypatch.setenv("GPUD_EVENT_LOOP", asked)
    cluster = LiveCluster(tmp_path)
    try:
        cluster.start_controller()
        assert served_loop(cluster) == runs
        cluster.start_node("n1", gpus=2)
        marker = cluster.workdir / "ran"
        job_id = cluster.submit(command=["sh", "-c", f'echo "$CUDA_VISIBLE_DEVICES" > {marker}'], gpus=1)
        assert cluster.wait_state(job_id, "COMPLETED", "FAILED")["state"] == "COMPLETED"
        assert marker.read_text().startswith("GPU-")  # the node gave the task one of its GPUs
    finally:
        cluster.close()


def test_an_unknown_loop_is_refused_before_a_store_is_made(tmp_path, monkeypatch):
    monkeypatch.setenv("GPUD_EVENT_LOOP", "tokio")
    state = tmp_path / "state"
    done = subprocess.run([sys.executable, "-m", "gpud.cli.gpud_main", "controller", "--listen", "127.0.0.1:0",
                           "--state-dir", str(state), "--init", "--allow-root"],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2, done
    assert "GPUD_EVENT_LOOP='tokio'" in done.stderr and "uvloop or asyncio" in done.stderr
    assert not (state / "gpud.sqlite").exists()
