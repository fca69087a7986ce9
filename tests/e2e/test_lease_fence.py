"""The lease fence: with the node daemon and its supervisor both killed, the node's tasks still stop in time.

Real processes throughout: a controller and two node daemons on
127.0.0.1, or a task table with its supervisor and a lease file written
here. Each task copy appends a timestamp to a file of its own every 50 ms;
those heartbeats say when each copy ran, whatever the daemons recorded.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from daemons import POLICY, LiveCluster, wait_for
from gpud.node import cgroups, failsafe, fence, freezer, lease, procs
from gpud.node.launch import child_env
from gpud.node.spec import TaskKey
from gpud.node.taskstate import EXITED, Layout, read_state
from gpud.node.tasks import TaskTable
from gpud.wire.task import ExitCause
from node_helpers import kill_everything, running, spec
from waiting import observe

LEASE_S = 3.0
GRACE_S = 1.0
BEAT_S = 0.05
# Appends a timestamp to beat-<job>-<restart count> every 50 ms; deaf to SIGTERM, so only SIGKILL ends it.
BEATER = ["sh", "-c", "trap '' TERM; f=beat-$GPUD_JOB_ID-$GPUD_RESTART_COUNT; "
                      f"while true; do date +%s.%N >> $f; sleep {BEAT_S}; done"]


def _beats(path: Path) -> list[float]:
    try:
        return [float(line) for line in path.read_text().split()]
    except (OSError, ValueError):
        return []


def _supervisor_of(state_dir: Path) -> int:
    tasks_dir = Layout(str(state_dir)).tasks_dir
    for name in os.listdir(tasks_dir):
        state = read_state(os.path.join(tasks_dir, name))
        if state is not None and state.state != EXITED and state.supervisor_pid:
            return state.supervisor_pid
    raise AssertionError(f"no running task in {tasks_dir}")


@pytest.mark.timeout(180)
def test_a_job_never_runs_twice_when_the_node_daemon_and_its_supervisor_are_killed(tmp_path):
    cluster = LiveCluster(tmp_path, policy=POLICY.replace("grace_period = 2", f"grace_period = {GRACE_S:g}"),
                          node_timeout_s=LEASE_S, heartbeat_s=0.3)
    try:
        cluster.start_controller()
        cluster.start_node("n1", gpus=1)
        job_id = cluster.submit(command=BEATER, gpus=1, cpus=0.1)
        first, second = cluster.workdir / f"beat-{job_id}-0", cluster.workdir / f"beat-{job_id}-1"
        wait_for(lambda: len(_beats(first)) > 5, "the job to beat on n1")
        cluster.start_node("n2", gpus=1)
        run_root = tmp_path / "n1"
        fenced_by = fence.fence_pid(str(run_root))
        assert fenced_by is not None, "a node holding a lease has a fence running"
        daemon, supervisor = cluster.nodes["n1"].pid, _supervisor_of(run_root)
        time.sleep(2 * LEASE_S)  # a healthy daemon renews its lease: the fence leaves the job alone
        beaten = len(_beats(first))
        wait_for(lambda: len(_beats(first)) > beaten + 3, "the job to beat on after two lease periods")
        assert not second.exists()
        died = time.time()
        os.kill(daemon, signal.SIGKILL)
        os.kill(supervisor, signal.SIGKILL)
        wait_for(lambda: len(_beats(second)) > 20, "the job to be requeued and beat on n2", timeout=60)
        job = cluster.job(job_id)
        assert job["nodes"] == ["n2"] and job["restart_count"] == 1
        old, new = _beats(first), _beats(second)
        # The old copy's last beat came before the new copy's first, by more than a beat's interval.
        gap = new[0] - old[-1]
        # The old copy stopped around the lease's end plus the job's grace, and the fence recorded it and left.
        tasks_dir = Layout(str(run_root)).tasks_dir
        states = [s for s in (read_state(os.path.join(tasks_dir, name)) for name in os.listdir(tasks_dir)) if s]
        assert [(s.state, s.reason, s.cause) for s in states] == [(EXITED, lease.FENCED_REASON, ExitCause.FENCED)]
        down = next(e["time"] for e in job["events"] if e["kind"] == "node failure")
        print(f"\nkilled at 0; old copy's last beat +{old[-1] - died:.2f} s; fence recorded its end "
              f"+{states[0].ended - died:.2f} s; node down and job requeued +{down - died:.2f} s; new copy's first "
              f"beat +{new[0] - died:.2f} s; gap {gap:.2f} s; overlap {max(0.0, -gap):.2f} s")
        assert gap > BEAT_S, f"the two copies ran together for {-gap:.2f} s"
        wait_for(lambda: not procs.same_process(fenced_by, None), "the fence to exit")
        prefix = cgroups.cgroup_name(tasks_dir, "")
        host = cgroups.host()
        left = [name for base in [*host.v1.values(), *([host.v2] if host.v2 else [])] if os.path.isdir(base)
                for name in os.listdir(base) if name.startswith(prefix)]
        assert left == [], "the fenced task's cgroups are removed"
    finally:
        cluster.close()


class Renewer:
    """Plays the daemon's part: renews the lease in ``run_root`` every 0.2 s until stopped."""

    def __init__(self, run_root: str, lease_s: float, grace_s: float) -> None:
        self.path = lease.lease_path(run_root)
        self.lease_s, self.grace_s = lease_s, grace_s
        self.renew()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def renew(self) -> None:
        """Grant the lease for ``lease_s`` from now."""
        lease.write_lease(self.path, lease.Lease(time.monotonic() + self.lease_s, self.lease_s, self.grace_s))

    def _run(self) -> None:
        while not self._stop.wait(0.2):
            self.renew()

    def stop(self) -> float:
        """Stop renewing; returns when the lease runs out (``time.monotonic()``)."""
        self._stop.set()
        self._thread.join(5)
        held = lease.read_lease(self.path)
        assert held is not None
        return held.expires


class Beating:
    """Plays the slicer's part: keeps its heartbeat fresh, so nothing thaws a task but the fence."""

    def __init__(self, run_root: str) -> None:
        self.path = failsafe.heartbeat_path(run_root)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            failsafe.beat(self.path)
            self._stop.wait(0.2)

    def stop(self) -> None:
        """Stop beating."""
        self._stop.set()
        self._thread.join(5)


@pytest.fixture
def node(tmp_path):
    state_dir = tmp_path / "state"
    table = TaskTable(Layout(str(state_dir)))
    table.adopt()
    workdir = tmp_path / "work"
    workdir.mkdir()
    yield table, workdir
    table.launcher.close()
    kill_everything(str(state_dir))


def _frozen(task_dir: str) -> bool:
    group = freezer.task_cgroup(task_dir)
    assert group is not None, "a time-sliced task has a freezer cgroup here"
    name = "cgroup.freeze" if os.path.exists(os.path.join(group, "cgroup.freeze")) else "freezer.state"
    with open(os.path.join(group, name)) as f:
        return f.read().strip() in ("1", "FROZEN")


@pytest.mark.skipif(freezer.freezer_root() is None, reason="no cgroup freezer we may write here")
@pytest.mark.timeout(120)
def test_the_fence_thaws_and_stops_a_frozen_time_sliced_task_whose_supervisor_died(node):
    table, workdir = node
    run_root = table.layout.run_root
    renewer = Renewer(run_root, lease_s=2.0, grace_s=5.0)
    slicer = Beating(run_root)
    try:
        key = TaskKey(f"z{os.getpid()}", 0, 0)
        # It beats, and on SIGTERM writes "heard TERM" and exits: what it heard shows it was thawed first.
        script = ("trap 'echo heard TERM > heard; exit 0' TERM\n"
                  f"while true; do date +%s.%N >> beats; sleep {BEAT_S}; done\n")
        table.start(key, spec(workdir, ["sh", "-c", script], grace_s=0.5,
                              time_slicing={"mode": "strict", "lease_ms": 50, "precision": 0.1, "request": 0.5,
                                            "limit": 0.5}))
        state = running(table, key)
        process = fence.ensure(run_root, child_env())
        assert process is not None
        wait_for(lambda: fence.running(run_root), "the fence to take its lock")
        wait_for(lambda: len(_beats(workdir / "beats")) > 3, "the task to beat")
        task_dir = table.layout.task_dir(key)
        freezer.freezer_for(task_dir, state.pid).freeze()
        wait_for(lambda: _frozen(task_dir), "the task to be frozen")
        os.kill(state.supervisor_pid, signal.SIGKILL)
        wait_for(lambda: not procs.same_process(state.supervisor_pid, None), "the supervisor to die")
        frozen_beats = len(_beats(workdir / "beats"))
        expires = renewer.stop()
        wait_for(lambda: (read_state(task_dir) or state).state == EXITED, "the fence to stop the task", timeout=30)
        fired = time.monotonic()
        assert (workdir / "heard").read_text().strip() == "heard TERM", "thawed, then told to stop"
        assert (read_state(task_dir).reason, read_state(task_dir).cause) == (lease.FENCED_REASON, ExitCause.FENCED)
        assert fired - expires < 3.0, "stopped promptly once the lease ran out"
        assert len(_beats(workdir / "beats")) >= frozen_beats
        assert not procs.group_alive(state.pid)
        assert freezer.task_cgroup(task_dir) is None, "its freezer cgroup is removed"
        process.wait(timeout=10)  # no task, no lease: the fence ends
        assert process.returncode == 0
    finally:
        slicer.stop()


@pytest.mark.timeout(120)
def test_the_fence_leaves_a_task_alone_while_the_lease_is_renewed_and_ends_with_its_tasks(node):
    table, workdir = node
    run_root = table.layout.run_root
    renewer = Renewer(run_root, lease_s=1.0, grace_s=0.5)
    key = TaskKey(f"h{os.getpid()}", 0, 0)
    table.start(key, spec(workdir, ["sh", "-c", f"while true; do date +%s.%N >> beats; sleep {BEAT_S}; done"],
                          grace_s=0.5))
    state = running(table, key)
    process = fence.ensure(run_root, child_env())
    assert process is not None
    wait_for(lambda: fence.running(run_root), "the fence to take its lock")
    assert fence.ensure(run_root, child_env()) is None, "one fence per node"
    # Three lease periods, renewed all along: the task lives throughout.
    assert all(observe(lambda: procs.group_alive(state.pid), 3.0, 0.05))
    assert (read_state(table.layout.task_dir(key)) or state).state != EXITED
    beaten = len(_beats(workdir / "beats"))
    wait_for(lambda: len(_beats(workdir / "beats")) > beaten + 3, "the task to beat on after three lease periods")
    assert process.poll() is None, "the fence watches while a task runs"
    table.stop(key, "cancelled")
    wait_for(lambda: (read_state(table.layout.task_dir(key)) or state).state == EXITED, "the task to stop")
    assert read_state(table.layout.task_dir(key)).reason == "stopped"
    renewer.stop()
    process.wait(timeout=15)  # its task is over and no lease is renewed: it ends
    assert not fence.running(run_root)


@pytest.mark.timeout(60)
def test_an_idle_fence_ends_with_the_daemon_that_started_it(tmp_path):
    run_root = tmp_path / "run"
    Layout(str(run_root)).create()
    lease.write_lease(lease.lease_path(str(run_root)), lease.Lease(time.monotonic() + 600, 600, 30))
    daemon = subprocess.Popen(["sleep", "60"])  # stands in for the daemon: only its life counts
    process = subprocess.Popen([sys.executable, "-m", "gpud.node.fence", str(run_root), str(daemon.pid)],
                               env=child_env())
    try:
        wait_for(lambda: fence.running(str(run_root)), "the fence to take its lock")
        assert all(answer is None for answer in observe(process.poll, 1.0, 0.05)), \
            "with its daemon alive and a lease held, it watches"
        daemon.kill()
        daemon.wait()
        assert process.wait(timeout=15) == 0, "no task and no daemon: it ends, though the lease has 600 s left"
    finally:
        for child in (daemon, process):
            if child.poll() is None:
                child.kill()
                child.wait()


@pytest.mark.skipif(freezer.freezer_root() is None, reason="no cgroup freezer we may write here")
@pytest.mark.timeout(120)
def test_a_frozen_task_runs_again_soon_after_the_daemon_the_slicer_and_the_supervisor_die(node):
    table, workdir = node
    run_root = table.layout.run_root
    lease.write_lease(lease.lease_path(run_root), lease.Lease(time.monotonic() + 600, 600, 30))
    slicer = Beating(run_root)
    daemon = subprocess.Popen(["sleep", "120"])  # stands in for the daemon, which holds the slicer
    try:
        key = TaskKey(f"t{os.getpid()}", 0, 0)
        table.start(key, spec(workdir, ["sh", "-c", f"while true; do date +%s.%N >> beats; sleep {BEAT_S}; done"],
                              time_slicing={"mode": "strict", "lease_ms": 50, "precision": 0.1, "request": 0.5,
                                            "limit": 0.5}))
        state = running(table, key)
        fenced_by = subprocess.Popen([sys.executable, "-m", "gpud.node.fence", run_root, str(daemon.pid)],
                                     env=child_env())
        wait_for(lambda: fence.running(run_root), "the fence to take its lock")
        wait_for(lambda: len(_beats(workdir / "beats")) > 3, "the task to beat")
        task_dir = table.layout.task_dir(key)
        freezer.freezer_for(task_dir, state.pid).freeze()
        wait_for(lambda: _frozen(task_dir), "the task to be frozen")
        os.kill(state.supervisor_pid, signal.SIGKILL)
        daemon.kill()
        slicer.stop()
        died = time.time()
        frozen_beats = len(_beats(workdir / "beats"))
        wait_for(lambda: len(_beats(workdir / "beats")) > frozen_beats + 3, "the task to run again", timeout=30)
        resumed = _beats(workdir / "beats")[frozen_beats]
        assert resumed - died < failsafe.SILENCE_S + 3.0, "thawed once the slicer fell silent, not at the lease's end"
        assert fenced_by.poll() is None, "the task still runs under its lease: the fence watches on"
    finally:
        slicer.stop()
        if daemon.poll() is None:
            daemon.kill()
        daemon.wait()
