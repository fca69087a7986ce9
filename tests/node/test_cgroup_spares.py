"""Spare cgroups: a finished task's v1 groups serve the next task with the same limits, under its name.

Runs where the host has writable cgroup v1 hierarchies (root); every group a
test makes is gone when it ends.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys

import pytest

from gpud.node import cgroups, cgspares, procs
from gpud.node.spec import TaskKey
from gpud.node.taskstate import EXITED, Layout, read_state
from gpud.node.tasks import TaskTable
from node_helpers import kill_everything, run_to_end, running, spec, wait_for

HOST = cgroups.detect()
pytestmark = pytest.mark.skipif(not HOST.v1, reason="this host lets us make no cgroup v1 group (not root, or none "
                                                    "writable)")
MIB = 1 << 20
# Peak memory: touches 150 MiB, so a later task's peak shows whether the group's peak was reset.
HOG = "b = bytearray(150 * 2**20)\nfor i in range(0, len(b), 4096): b[i] = 1\n"


@pytest.fixture
def state_dir(tmp_path):
    path = tmp_path / "state"
    yield path
    kill_everything(str(path))
    for group in _groups(Layout(str(path)).tasks_dir):
        task = cgroups.TaskCgroup(os.path.basename(group), cgroups.Hierarchies(v1={"any": os.path.dirname(group)}))
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


def _groups(tasks_dir: str, part: str = "") -> list[str]:
    """This node's cgroup directories (named after a task directory, or spares: ``part`` "spare-") now."""
    prefix = cgroups.cgroup_name(tasks_dir, part)
    found = []
    for base in [*HOST.v1.values(), *([HOST.v2] if HOST.v2 else [])]:
        if os.path.isdir(base):
            found += [os.path.join(base, name) for name in os.listdir(base) if name.startswith(prefix)]
    return sorted(found)


def _spares(table: TaskTable) -> list[str]:
    return _groups(table.layout.tasks_dir, "spare-")


def _one_v1(paths: list[str]) -> str:
    """Of a task's or a spare's directories, the one in the first v1 hierarchy."""
    base = next(iter(HOST.v1.values()))
    return next(path for path in paths if os.path.dirname(path) == base)


def _task_spec(workdir, command: list[str], **fields) -> dict:
    return spec(workdir, command, cpus=0.5, memory_gib=0.5, gpu_uuids=["GPU-fake-0"], gpu_indices=[0], **fields)


def test_the_next_task_with_the_same_limits_gets_the_finished_tasks_groups_under_its_own_name(table, workdir):
    first = TaskKey(f"a{os.getpid()}", 0, 0)
    table.start(first, _task_spec(workdir, [sys.executable, "-c", HOG]))
    assert run_to_end(table, first, timeout=60).max_rss_bytes >= 150 * MIB
    wait_for(lambda: _groups(table.layout.tasks_dir, first.dirname) == [] and _spares(table))
    spare = _one_v1(_spares(table))
    kept = os.stat(spare).st_ino

    second = TaskKey(f"b{os.getpid()}", 0, 0)
    table.start(second, _task_spec(workdir, ["sleep", "0.5"]))
    running(table, second)
    mine = _groups(table.layout.tasks_dir, second.dirname)
    assert len(mine) == len(HOST.v1) + (1 if HOST.v2 else 0)
    assert os.stat(_one_v1(mine)).st_ino == kept, "the spare's v1 groups, renamed"
    assert not os.path.exists(spare)
    if "memory" in HOST.v1:
        memory = os.path.join(HOST.v1["memory"], cgroups.cgroup_name(table.layout.tasks_dir, second.dirname))
        assert int(open(os.path.join(memory, "memory.limit_in_bytes")).read()) == 512 * MIB
    state = run_to_end(table, second)
    assert state.exit_code == 0
    if "memory" in HOST.v1:
        assert state.max_rss_bytes is not None and state.max_rss_bytes < 100 * MIB, "the peak starts again"


@pytest.mark.skipif("memory" not in HOST.v1, reason="the host has no writable memory cgroup")
def test_a_spare_keeps_no_more_than_a_little_memory_charged(table, workdir):
    # 32 MiB of page cache written (and synced, so it can be reclaimed) stays charged to the task's memory group
    # after it ends; the next task must not start with that less of its limit.
    key = TaskKey(f"w{os.getpid()}", 0, 0)
    table.start(key, _task_spec(workdir, ["dd", "if=/dev/zero", f"of={workdir / 'cached'}", "bs=1M", "count=32",
                                          "conv=fsync"]))
    assert run_to_end(table, key, timeout=60).exit_code == 0
    wait_for(lambda: _groups(table.layout.tasks_dir, key.dirname) == [])
    charged = [int(open(os.path.join(path, "memory.usage_in_bytes")).read())
               for path in _spares(table) if os.path.dirname(path) == HOST.v1["memory"]]
    assert all(bytes_ <= cgspares.MAX_LEFT_CHARGED for bytes_ in charged), charged


def test_a_task_with_other_limits_gets_groups_of_its_own(table, workdir):
    first = TaskKey(f"c{os.getpid()}", 0, 0)
    table.start(first, _task_spec(workdir, ["true"]))
    run_to_end(table, first)
    wait_for(lambda: _spares(table))
    spare = _one_v1(_spares(table))
    kept = os.stat(spare).st_ino
    second = TaskKey(f"d{os.getpid()}", 0, 0)
    table.start(second, spec(workdir, ["sleep", "0.5"], cpus=0.5, memory_gib=0.25, gpu_uuids=["GPU-fake-0"],
                             gpu_indices=[0]))
    running(table, second)
    assert os.stat(_one_v1(_groups(table.layout.tasks_dir, second.dirname))).st_ino != kept
    assert os.path.exists(spare), "kept for a task with its limits"
    run_to_end(table, second)


@pytest.mark.skipif("memory" not in HOST.v1, reason="the host has no writable memory cgroup")
def test_the_groups_of_a_task_killed_out_of_memory_are_removed_not_kept(table, workdir):
    key = TaskKey(f"o{os.getpid()}", 0, 0)
    hog = "b = bytearray(400 * 2**20)\nfor i in range(0, len(b), 4096): b[i] = 1\n"
    table.start(key, spec(workdir, [sys.executable, "-c", hog], memory_gib=100 / 1024))
    assert run_to_end(table, key, timeout=30).reason.startswith("out of memory")
    # A task started after it, with other limits: once its groups are parked, the OOM-killed task's were looked at.
    marker = TaskKey(f"p{os.getpid()}", 0, 0)
    table.start(marker, spec(workdir, ["true"], memory_gib=50 / 1024))
    run_to_end(table, marker)
    wait_for(lambda: _groups(table.layout.tasks_dir, key.dirname) == [] and _spares(table))
    assert len({os.path.basename(path) for path in _spares(table)}) == 1, "the marker's alone"
    assert _groups(table.layout.tasks_dir, marker.dirname) == []


def test_a_group_with_a_process_left_in_it_is_never_kept(tmp_path):
    group = cgroups.TaskCgroup(cgroups.cgroup_name(str(tmp_path), f"x{os.getpid()}.0.0"), HOST)
    limits = cgroups.Limits(memory_bytes=256 * MIB)
    group.create(limits)
    lingering = subprocess.Popen(["sleep", "60"])
    try:
        for path in group.v1.values():
            with open(os.path.join(path, "cgroup.procs"), "w") as f:
                f.write(str(lingering.pid))
        spares = cgspares.Spares()
        spares.park(group, limits, reusable=True)
        assert spares.count() == 0
        assert all(os.path.isdir(path) for path in group.v1.values()), "left where it is, with its process"
    finally:
        os.kill(lingering.pid, signal.SIGKILL)
        lingering.wait()
        group.kill()
        assert group.remove()


def test_a_supervisor_removes_its_spares_when_it_exits(table, workdir):
    key = TaskKey(f"e{os.getpid()}", 0, 0)
    table.start(key, _task_spec(workdir, ["true"]))
    supervisor = running(table, key).supervisor_pid
    run_to_end(table, key)
    wait_for(lambda: _spares(table))
    table.launcher.close()
    wait_for(lambda: not procs.same_process(supervisor, None))
    assert _groups(table.layout.tasks_dir) == []


def test_the_spares_of_a_killed_supervisor_are_removed_when_the_node_daemon_starts_again(state_dir, workdir):
    first = TaskTable(Layout(str(state_dir)))
    first.adopt()
    key = TaskKey(f"k{os.getpid()}", 0, 0)
    first.start(key, _task_spec(workdir, ["true"]))
    run_to_end(first, key)
    wait_for(lambda: _spares(first))
    _kill_supervisor(first, key)
    assert _spares(first), "left behind by the killed supervisor"
    _assert_started_again_leaves_no_group(first, state_dir)


def test_the_groups_a_supervisor_killed_while_keeping_spares_left_are_removed_when_the_node_daemon_starts_again(
        state_dir, workdir):
    first, _, recorded = _spares_of_a_killed_supervisor(state_dir, workdir, "h")
    # Killed between two renames, a supervisor leaves one hierarchy's group under the task's name.
    spare = _one_v1(_spares(first))
    os.rename(spare, os.path.join(os.path.dirname(spare), recorded.name))
    _assert_started_again_leaves_no_group(first, state_dir)


def test_the_groups_of_a_forgotten_task_its_killed_supervisor_never_kept_are_removed_when_the_node_daemon_starts_again(
        state_dir, workdir):
    first, task_dir, recorded = _spares_of_a_killed_supervisor(state_dir, workdir, "f")
    # Killed after the daemon forgot the task (its directory, which records the groups, deleted) but before it
    # kept the groups as spares: they are left under the task's name, and nothing records them.
    for spare in _spares(first):
        os.rename(spare, os.path.join(os.path.dirname(spare), recorded.name))
    shutil.rmtree(task_dir)
    assert _groups(first.layout.tasks_dir)
    _assert_started_again_leaves_no_group(first, state_dir)


def _spares_of_a_killed_supervisor(state_dir, workdir, prefix: str) -> tuple[TaskTable, str, cgroups.TaskCgroup]:
    """A task run to its end on a node table of its own, every hierarchy's group kept as a spare, then its
    supervisor killed: the table, the task's directory and the groups it recorded."""
    first = TaskTable(Layout(str(state_dir)))
    first.adopt()
    key = TaskKey(f"{prefix}{os.getpid()}", 0, 0)
    first.start(key, _task_spec(workdir, ["true"]))
    run_to_end(first, key)
    task_dir = first.layout.task_dir(key)
    recorded = cgroups.recorded(task_dir)
    assert recorded is not None and recorded.v1
    wait_for(lambda: len(_spares(first)) == len(recorded.v1))
    _kill_supervisor(first, key)
    return first, task_dir, recorded


def _kill_supervisor(table: TaskTable, key: TaskKey) -> None:
    supervisor = read_state(table.layout.task_dir(key)).supervisor_pid
    os.kill(supervisor, signal.SIGKILL)
    wait_for(lambda: not procs.same_process(supervisor, None))


def _assert_started_again_leaves_no_group(first: TaskTable, state_dir) -> None:
    """The node daemon started again (a second table on ``first``'s state directory) leaves no cgroup of the node."""
    second = TaskTable(Layout(str(state_dir)))
    try:
        second.adopt()
        assert _groups(second.layout.tasks_dir) == []
    finally:
        second.launcher.close()
        first.launcher.close()


def test_the_spares_of_a_supervisor_that_died_are_removed_by_the_daemon_that_started_it(table, workdir):
    key = TaskKey(f"g{os.getpid()}", 0, 0)
    table.start(key, _task_spec(workdir, ["true"]))
    run_to_end(table, key)
    wait_for(lambda: _spares(table))
    os.kill(read_state(table.layout.task_dir(key)).supervisor_pid, signal.SIGKILL)
    wait_for(lambda: table.refresh() is not None and _groups(table.layout.tasks_dir) == [])


@pytest.mark.skipif("cpu" not in HOST.v1, reason="the host has no writable cpu cgroup")
def test_a_task_in_a_spare_starts_with_its_whole_cpu_quota_whatever_the_earlier_tasks_ran_this_period(
        table, workdir):
    # A tenth of a CPU is 10 ms per 100 ms period. Each short task (and its start, forked inside its groups) runs
    # about a millisecond: tens of them back to back in one set of groups run more than 10 ms in a period, which a
    # reused group would count against the next task, throttling its start. Each task gets its own quota.
    for n in range(40):
        key = TaskKey(f"q{os.getpid()}-{n}", 0, 0)
        table.start(key, spec(workdir, ["true"], cpus=0.1, memory_gib=0.5, gpu_uuids=["GPU-fake-0"], gpu_indices=[0]))
        assert _ended(table, key).exit_code == 0
    wait_for(lambda: _groups(table.layout.tasks_dir, "q") == [] and _spares(table))
    throttled = {path: _keyed(os.path.join(path, "cpu.stat"), "nr_throttled")
                 for path in _spares(table) if os.path.dirname(path) == HOST.v1["cpu"]}
    assert throttled and not any(throttled.values()), throttled


def _ended(table: TaskTable, key: TaskKey):
    """The task's final state, looked for every millisecond (run_to_end looks every 20)."""
    def ended():
        table.refresh([key])
        state = table.get(key)
        return state if state is not None and state.state == EXITED else None
    return wait_for(ended, interval=0.001)


def _keyed(path: str, key: str) -> int:
    with open(path) as f:
        return next(int(value) for name, value in (line.split() for line in f) if name == key)
