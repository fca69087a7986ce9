"""A supervisor stops its tasks by the lease's end plus the grace period, however late it sees the lease run out.

The controller starts a silent node's jobs elsewhere counting from the
lease's end (gpud/controller/node_messages.py): a supervisor that got to
run late on a busy host must not give the task a full grace period from
that moment. A real task that ignores its stop signal, run by a TaskRun in
this process; the lease is one that ran out seconds ago.
"""

from __future__ import annotations

import os
import signal
import time

import pytest

from gpud.node import cgroups, cgspares, lease
from gpud.node.spec import TaskKey
from gpud.node.supervisor import TaskRun
from gpud.node.taskstate import STOP_FILE, write_json
from gpud.wire.task import ExitCause
from node_helpers import spec, wait_for

# Ignores SIGTERM, so only the SIGKILL ends it; says so with the file "ignoring" in its work directory.
STUBBORN = ["python3", "-c", "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
            "open('ignoring', 'w').close(); time.sleep(600)"]
GRACE_S = 30.0  # the job's own grace period: far longer than the lease's
LEASE_GRACE_S = 1.0


@pytest.fixture
def run(tmp_path, monkeypatch):
    """A started task that ignores SIGTERM, with a grace period of GRACE_S; killed after the test, and its
    cgroups removed."""
    monkeypatch.chdir(os.getcwd())  # a TaskRun enters the work directory to check it
    workdir = tmp_path / "work"
    workdir.mkdir()
    key = TaskKey(f"l{os.getpid()}", 0, 0)
    task_dir = tmp_path / "state" / "tasks" / key.dirname
    task_dir.mkdir(parents=True)
    order = {"key": key.to_json(), "spec": spec(str(workdir), STUBBORN, grace_s=GRACE_S).to_json(),
             "checkpoint_dir": str(tmp_path / "checkpoints")}
    task = TaskRun(str(task_dir), order, (os.getpid(), None), lambda key: None, cgroups.Confiner(), cgspares.Spares())
    assert task.begin(), task.state.reason
    wait_for(lambda: (workdir / "ignoring").exists(), 60)
    yield task
    if task.leader_status is None:
        os.killpg(task.pid, signal.SIGKILL)
        os.waitpid(task.pid, 0)
    if task.cgroup is not None:  # the task's groups go with it, as the supervisor's end of a task takes them
        assert task.cgroup.remove(), task.cgroup.paths()


def _ran_out(seconds_ago: float) -> lease.Lease:
    return lease.Lease(time.monotonic() - seconds_ago, 2.0, LEASE_GRACE_S)


def _ends_by_sigkill(task: TaskRun) -> None:
    status = os.waitpid(task.pid, 0)[1]
    task.leader_status = status
    assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL


def test_a_lease_seen_run_out_late_kills_the_task_at_the_leases_end_plus_its_grace(run):
    held = _ran_out(5.0)
    now = time.monotonic()
    assert run.fence(held, now)
    assert run.stopping_cause is ExitCause.FENCED
    # Due at the lease's end plus its grace, long past: not GRACE_S (nor LEASE_GRACE_S) from now.
    assert run.kill_at == pytest.approx(held.expires + LEASE_GRACE_S)
    run.tick(time.monotonic(), [])
    _ends_by_sigkill(run)


def test_a_task_the_lease_finds_stopping_with_a_long_grace_is_killed_by_the_leases_deadline(run):
    write_json(os.path.join(run.task_dir, STOP_FILE), {"signal": "TERM", "grace_s": GRACE_S, "reason": "cancelled"})
    run.look_at_stop_request()
    assert run.kill_at is not None and run.kill_at > time.monotonic() + GRACE_S - 5
    held = _ran_out(0.5)
    assert not run.fence(held, time.monotonic())  # its stop had begun: not begun again
    assert run.kill_at == pytest.approx(held.expires + LEASE_GRACE_S)
    wait_for(lambda: (run.tick(time.monotonic(), []), run.kill_at is None)[1], 10)  # SIGKILL in half a second
    _ends_by_sigkill(run)


def test_a_lease_that_ran_out_just_now_leaves_the_task_its_grace(run):
    held = _ran_out(0.0)
    now = time.monotonic()
    assert run.fence(held, now)
    assert run.kill_at == pytest.approx(held.expires + LEASE_GRACE_S, abs=0.05)
    assert run.kill_at > now
