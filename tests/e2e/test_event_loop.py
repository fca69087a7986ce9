"""The controller daemon runs on uvloop's event loop, or on asyncio's own when GPUD_EVENT_LOOP asks.

Real controller and node processes on 127.0.0.1: the loop each serves on is
read from its /metrics (gpud_event_loop_info), and a job runs end to end
over the nodes' WebSocket on it. Where uvloop cannot be imported, the
controller warns and serves on asyncio's loop, unless GPUD_EVENT_LOOP named
uvloop; an unknown GPUD_EVENT_LOOP, or uvloop named and missing, is refused
before the controller makes or opens anything.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

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


def without_uvloop(tmp_path: Path, monkeypatch) -> None:
    """Child processes of the test find a uvloop that cannot be imported, as on an install without it."""
    blocked = tmp_path / "blocked"
    blocked.mkdir()
    (blocked / "uvloop.py").write_text('raise ImportError("no uvloop here")\n')
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(blocked), os.environ.get("PYTHONPATH")])))


def test_without_uvloop_the_controller_warns_and_serves_on_asyncios_loop(tmp_path, monkeypatch):
    monkeypatch.delenv("GPUD_EVENT_LOOP", raising=False)
    without_uvloop(tmp_path, monkeypatch)
    cluster = LiveCluster(tmp_path)
    try:
        cluster.start_controller()
        assert served_loop(cluster) == "asyncio"
        assert "uvloop cannot be imported (no uvloop here)" in cluster.controller.output()
    finally:
        cluster.close()


def test_uvloop_named_but_missing_is_refused_before_a_store_is_made(tmp_path, monkeypatch):
    monkeypatch.setenv("GPUD_EVENT_LOOP", "uvloop")
    without_uvloop(tmp_path, monkeypatch)
    state = tmp_path / "state"
    done = subprocess.run([sys.executable, "-m", "gpud.cli.gpud_main", "controller", "--listen", "127.0.0.1:0",
                           "--state-dir", str(state), "--init", "--allow-root"],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2, done
    assert "GPUD_EVENT_LOOP=uvloop, but uvloop cannot be imported (no uvloop here)" in done.stderr
    assert not (state / "gpud.sqlite").exists()
