"""Every way a task ends removes its cgroups: exit, signal, exec failure, OOM, node stop, node restart.

Each test counts the task's cgroup directories (in every hierarchy the host
lets us use) while it runs and after it ended; none may be left.
"""

from __future__ import annotations

import os
import signal
import sys

import pytest

from gpud.node import cgroups, procs
from gpud.node.spec import TaskKey
from gpud.node.taskstate import Layout, read_state
from gpud.node.tasks import TaskTable
from node_helpers import kill_everything, run_to_end, running, spec, wait_for

HOST = cgroups.detect()
pytestmark = pytest.mark.skipif(not HOST.tracked(), reason="this host lets us make no cgroup (not root, or none "
                                                           "writable)")


@pytest.fixture
def state_dir(tmp_path):
    path = tmp_path / "state"
    yield path
    kill_everything(str(path))
    for group in _groups(Layout(str(path)).tasks_dir):
        task = cgroups.TaskCgroup(os.path.basename(group), HOST)
        task.kill()
        task.remove()


@pytest.fixture
def table(state_dir):
    table = TaskTable(Layout(str(state_dir)))
    table.adopt()
    yield table
    table.launcher.close()


@pytest.fixture
def workdir(tmp_path):
    path = tmp_path / "work"
    path.mkdir()
    return path


def _groups(tasks_dir: str, dirname: str = "") -> list[str]:
    """The cgroup directories of the node's tasks (of one task, given its directory name) that exist now."""
    prefix = cgroups.cgroup_name(tasks_dir, dirname)
    found = []
    for base in [*HOST.v1.values(), *([HOST.v2] if HOST.v2 else [])]:
        if os.path.isdir(base):
            found += [os.path.join(base, name) for name in os.listdir(base) if name.startswith(prefix)]
    return found


def _all_removed(table: TaskTable, key: TaskKey) -> bool:
    return _groups(table.layout.tasks_dir, key.dirname) == []


def _count_while_running(table: TaskTable, key: TaskKey) -> int:
    running(table, key)
    return len(_groups(table.layout.tasks_dir, key.dirname))


EXPECTED = len(HOST.v1) + (1 if HOST.v2 else 0)


def test_an_exited_task_leaves_no_cgroup(table, workdir):
    key = TaskKey(f"x{os.getpid()}", 0, 0)
    assert _groups(table.layout.tasks_dir, key.dirname) == []
    table.start(key, spec(workdir, ["sh", "-c", "sleep 0.5"], cpus=0.5))
    assert _count_while_running(table, key) == EXPECTED
    assert run_to_end(table, key).exit_code == 0
    wait_for(lambda: _all_removed(table, key))


def test_a_task_killed_by_a_signal_leaves_no_cgroup(table, workdir):
    key = TaskKey(f"s{os.getpid()}", 0, 0)
    table.start(key, spec(workdir, ["sh", "-c", "sleep 0.5; kill -9 $$"], cpus=0.5))
    assert _count_while_running(table, key) == EXPECTED
    assert run_to_end(table, key).term_signal == signal.SIGKILL
    wait_for(lambda: _all_removed(table, key))


def test_a_task_whose_command_cannot_run_leaves_no_cgroup(table, workdir, state_dir):
    key = TaskKey(f"f{os.getpid()}", 0, 0)
    table.start(key, spec(workdir, [str(workdir / "no-such-program")]))
    state = run_to_end(table, key)
    assert state.reason.startswith("failed to start: cannot run"), state.reason
    wait_for(lambda: _all_removed(table, key))
    # The node stops (its supervisor finishes and exits): still none.
    supervisor = state.supervisor_pid
    table.launcher.close()
    wait_for(lambda: not procs.same_process(supervisor, None))
    assert _all_removed(table, key)


@pytest.mark.skipif("memory" not in HOST.enforced(), reason="the host has no writable memory cgroup")
def test_a_task_killed_out_of_memory_leaves_no_cgroup(table, workdir):
    key = TaskKey(f"o{os.getpid()}", 0, 0)
    hog = "b = bytearray(400 * 2**20)\nfor i in range(0, len(b), 4096): b[i] = 1\n"
    table.start(key, spec(workdir, [sys.executable, "-c", hog], memory_gib=100 / 1024))
    state = run_to_end(table, key, timeout=30)
    assert state.reason.startswith("out of memory"), state.reason
    wait_for(lambda: _all_removed(table, key))


def test_tasks_stopped_with_the_node_leave_no_cgroup(table, workdir):
    # A node stopped as a whole: its supervisor is told to stop every task (SIGTERM), then exits.
    keys = [TaskKey(f"n{os.getpid()}", i, 0) for i in range(2)]
    for key in keys:
        table.start(key, spec(workdir, ["sleep", "600"], cpus=0.5, grace_s=0.5))
    assert [_count_while_running(table, key) for key in keys] == [EXPECTED, EXPECTED]
    supervisor = read_state(table.layout.task_dir(keys[0])).supervisor_pid
    table.launcher.close()
    os.kill(supervisor, signal.SIGTERM)
    wait_for(lambda: not procs.same_process(supervisor, None), timeout=30)
    for key in keys:
        assert run_to_end(table, key).reason == "stopped"
        assert _all_removed(table, key)


def test_a_task_of_a_node_killed_and_restarted_leaves_no_cgroup(state_dir, workdir):
    first = TaskTable(Layout(str(state_dir)))
    first.adopt()
    key = TaskKey(f"r{os.getpid()}", 0, 0)
    first.start(key, spec(workdir, ["sleep", "600"], cpus=0.5))
    assert _count_while_running(first, key) == EXPECTED
    supervisor = read_state(first.layout.task_dir(key)).supervisor_pid
    os.kill(supervisor, signal.SIGKILL)  # the daemon (this table) and its supervisor die with the host up
    wait_for(lambda: not procs.same_process(supervisor, None))
    second = TaskTable(Layout(str(state_dir)))  # the restarted daemon
    second.adopt()
    try:
        state = run_to_end(second, key, timeout=30)
        assert state.reason == "supervisor lost"
        wait_for(lambda: _all_removed(second, key))
    finally:
        second.launcher.close()
        first.launcher.close()
