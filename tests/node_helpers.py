"""Shared helpers for the node tests: run tasks through a TaskTable, wait for them, kill what they left."""

from __future__ import annotations

import os
import pwd
import signal
import time
from typing import Callable

from waiting import poll

from gpud.node import cgroups, cgspares, fence, freezer, procs
from gpud.node.spec import TaskKey, TaskSpec
from gpud.node.taskstate import EXITED, Layout, TaskState, read_state
from gpud.node.tasks import TaskTable

ME = pwd.getpwuid(os.getuid()).pw_name


def wait_for(predicate: Callable[[], object], timeout: float = 15.0, interval: float = 0.02) -> object:
    """Poll ``predicate`` until it returns something true; fail the test after ``timeout`` seconds."""
    value = poll(predicate, timeout, interval)
    assert value, f"timed out after {timeout} s waiting for {predicate}"
    return value


def spec_json(workdir: str, command: list[str] | None = None, **fields) -> dict:
    """A start order's spec, as JSON, run as the test's own user (who may be root: the spec allows it)."""
    base = {"user": ME, "allow_root": True, "workdir": str(workdir), "grace_s": 2.0}
    if command is not None:
        base["command"] = command
    return {**base, **fields}


def spec(workdir: str, command: list[str] | None = None, **fields) -> TaskSpec:
    """A start order's spec as the node reads it (see spec_json)."""
    return TaskSpec.decode(spec_json(workdir, command, **fields))


def run_to_end(table: TaskTable, key: TaskKey, timeout: float = 15.0) -> TaskState:
    """Wait until the task has exited and return its final state."""
    def done():
        table.refresh()
        state = table.get(key)
        return state if state is not None and state.state == EXITED else None
    return wait_for(done, timeout)


def running(table: TaskTable, key: TaskKey, timeout: float = 15.0) -> TaskState:
    """Wait until the task's process has started and return its state."""
    def started():
        table.refresh()
        state = table.get(key)
        return state if state is not None and state.pid else None
    return wait_for(started, timeout)


def kill_everything(state_dir: str) -> None:
    """SIGKILL the node's fence, every supervisor and task process group recorded in a node state directory;
    remove task cgroups and the killed supervisors' spare cgroups.

    Supervisors that have not recorded a task yet are found by their
    command line, which names the tasks directory or their task's directory.
    """
    tasks_dir = Layout(str(state_dir)).tasks_dir
    if not os.path.isdir(tasks_dir):
        return
    fenced_by = fence.fence_pid(Layout(str(state_dir)).run_root)
    if fenced_by is not None:
        _kill(fenced_by)
    supervisors = _supervisors_under(tasks_dir)
    for pid in supervisors:
        _kill(pid)
    for name in os.listdir(tasks_dir):
        group = freezer.task_cgroup(os.path.join(tasks_dir, name))
        if group is not None:  # a frozen process does not die of SIGKILL until it is thawed
            freezer.CgroupFreezer(group).thaw()
    for name in os.listdir(tasks_dir):
        state = read_state(os.path.join(tasks_dir, name))
        if state is None:
            continue
        if procs.same_process(state.supervisor_pid, state.supervisor_start):
            _kill(state.supervisor_pid)
            supervisors.append(state.supervisor_pid)
        if state.pid and procs.group_is_ours(state.pid, state.pid_start):
            procs.signal_group(state.pid, signal.SIGKILL)
    groups = [group for group in (cgroups.recorded(os.path.join(tasks_dir, name)) for name in os.listdir(tasks_dir))
              if group is not None]
    for group in groups:
        group.kill()
    deadline = time.monotonic() + 5
    for group in groups:
        # A killed process leaves its groups only once it has exited, which a loaded machine may take longer
        # to get to than one removal's retries: killed again and removed again until then.
        poll(lambda: group.kill() >= 0 and group.remove(), max(0.0, deadline - time.monotonic()))
    for name in os.listdir(tasks_dir):
        task_dir = os.path.join(tasks_dir, name)
        poll(lambda: freezer_group_removed(task_dir), max(0.0, deadline - time.monotonic()))
    poll(lambda: not any(procs.same_process(pid, None) for pid in supervisors), max(0.0, deadline - time.monotonic()),
         0.01)
    cgspares.remove_stale(tasks_dir)  # the spare cgroups the killed supervisors kept


def freezer_group_removed(task_dir: str) -> bool:
    """Try to remove the task's freezer cgroup (it goes once its killed processes are gone); whether it is gone."""
    if freezer.task_cgroup(task_dir):
        freezer.remove_task_cgroup(task_dir)
    return not freezer.task_cgroup(task_dir)


def _supervisors_under(tasks_dir: str) -> list[int]:
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/cmdline", "rb") as f:
                    argv = f.read().split(b"\0")
            except OSError:
                continue
            if b"gpud.node.supervisor" in argv and any(a == tasks_dir.encode() or a.startswith(tasks_dir.encode() + b"/")
                                                       for a in argv):
                found.append(int(entry))
    return found


def _kill(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def alive(pid: int) -> bool:
    """True while ``pid`` is a living (not zombie) process."""
    return procs.same_process(pid, None)
