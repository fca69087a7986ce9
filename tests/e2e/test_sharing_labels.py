"""Sharing a fake GPU through a real controller and node daemon: fair slicing's idle hand-off and memory policing
work because the fake GPUs see their processes, and `gpuctl show` says so; with the simulation off they say
advisory (GPUD_FAKE_GPU_SIMULATE=0 in the node daemon's environment)."""

from __future__ import annotations

import time

import pytest

from daemons import POLICY, LiveCluster, wait_for
from gpud.cli.job_cmd import show_text
from programs import FOREVER, until_exists
from waiting import observe

FAIR = POLICY + '\n[time_slicing]\nmode = "fair"\nlease_ms = 50\nprecision = 0.1\nmemory_grace = 1\n'
FROZEN = ("T", "D")  # SIGSTOP shows as T; the cgroup freezer as D


def proc_state(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/stat") as f:
            data = f.read()
    except OSError:
        return "gone"
    return data[data.rfind(")") + 2]


def frozen_part(pid: int, seconds: float) -> float:
    """The part of ``seconds`` the process spent frozen, sampled every 10 ms."""
    states = observe(lambda: proc_state(pid), seconds, 0.01)
    assert "gone" not in states
    return sum(state in FROZEN for state in states) / len(states)


def pid_file_command(path, body: str) -> list[str]:
    """A python job that writes its pid to ``path`` then runs ``body``."""
    return ["python3", "-c", f"import os, time\nopen({str(path)!r}, 'w').write(str(os.getpid()))\n{body}"]


@pytest.fixture
def fair_cluster(tmp_path):
    cluster = LiveCluster(tmp_path, policy=FAIR)
    cluster.start_controller()
    cluster.start_node("n1", gpus=1)
    yield cluster
    cluster.close()


def test_the_busy_job_of_a_fair_pair_gets_the_gpu_while_its_partner_sleeps(fair_cluster):
    cluster = fair_cluster
    busy_pid, idle_pid = cluster.workdir / "busy.pid", cluster.workdir / "idle.pid"
    busy = cluster.submit(command=pid_file_command(busy_pid, "while True: pass"), gpus=0.5)
    idle = cluster.submit(command=pid_file_command(idle_pid, FOREVER), gpus=0.5)
    for job_id in (busy, idle):
        job = cluster.wait_state(job_id, "RUNNING")
    text = show_text(job, job["started"])
    assert "of the GPU, enforced (fair time-slicing by the node" in text, text
    assert "slice, enforced (the node stops the job 1 s after it holds more than its slice" in text, text
    pid = int(wait_for(lambda: busy_pid.exists() and busy_pid.read_text(), "the busy job's pid"))
    wait_for(lambda: idle_pid.exists() and idle_pid.read_text(), "the idle job's pid")
    cluster.wait_cycles(3)  # a few plans: the sleeper is found idle
    # Blind to the sleeper's idleness, the busy job would be frozen about half the time (its 0.5 share).
    assert frozen_part(pid, 4.0) < 0.25


def test_a_job_holding_more_gpu_memory_than_its_slice_is_stopped(fair_cluster):
    cluster = fair_cluster
    go = cluster.workdir / "go"
    # 0.5 of an 80 GiB fake GPU: a 40 GiB slice (+5 %). It holds 30 GiB, then 50 GiB once told to.
    body = ("fd = os.memfd_create('fake-gpu-mem')  # the fake GPUs' convention (gpud.gpu.fakesim)\n"
            "os.ftruncate(fd, 30 << 30)\n"
            + until_exists(str(go)) +
            "os.ftruncate(fd, 50 << 30)\n" + FOREVER)
    job_id = cluster.submit(command=["python3", "-c", f"import os, time\n{body}"], gpus=0.5)
    job = cluster.wait_state(job_id, "RUNNING")
    assert "slice, enforced" in show_text(job, job["started"])
    time.sleep(2.5)  # within its slice: it keeps running past the grace period
    assert cluster.job(job_id)["state"] == "RUNNING"
    go.write_text("")
    job = cluster.wait_state(job_id, "FAILED", "CANCELLED", "COMPLETED", timeout=30)
    assert job["state"] == "FAILED", job
    assert "gpu memory: used 50.0 GiB, over its slice of 40.0 GiB" in job["reason"], job


def test_without_the_simulation_fake_gpus_are_shown_as_advisory(tmp_path, monkeypatch):
    monkeypatch.setenv("GPUD_FAKE_GPU_SIMULATE", "0")
    cluster = LiveCluster(tmp_path, policy=POLICY + '\n[time_slicing]\nmode = "fair"\n')
    try:
        cluster.start_controller()
        cluster.start_node("n1", gpus=1)
        job_id = cluster.submit(command=["sleep", "60"], gpus=0.5, project="alpha")
        job = cluster.wait_state(job_id, "RUNNING")
        sharing = job["sharing"]
        assert not sharing["compute"]["enforced"] and not sharing["memory"]["enforced"]
        text = show_text(job, job["started"])
        assert "of the GPU, advisory (advisory: node n1 cannot measure GPU utilisation" in text, text
        assert "slice, advisory (advisory: node n1 cannot measure each process's GPU memory)" in text, text
    finally:
        cluster.close()
