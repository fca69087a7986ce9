"""On a hybrid cgroup host a task's program runs only once the task is in all its groups (real cgroups).

The supervisor forks a task in its v2 group alone and moves it into its v1
groups (memory, cpu, cpuset, pids, devices) from a worker thread; the task
waits at a gate until then. Without the gate its first instructions would
run unconfined, and in cgroup v1 what it allocated then stays charged
elsewhere for good.
"""

from __future__ import annotations

import asyncio
import base64
import os
import signal
import threading

import pytest

from gpud.node import cgroups, cgspares, gate
from gpud.node.spec import TaskKey
from gpud.node.pty_session import Interactive
from gpud.node.supervisor import TaskRun
from gpud.node.taskstate import STOP_FILE, Layout
from gpud.node.tasks import TaskTable
from node_helpers import kill_everything, run_to_end, spec, wait_for

HOST = cgroups.detect()
pytestmark = pytest.mark.skipif(not HOST.gated(), reason="not a hybrid cgroup host (v1 hierarchies and a v2 mount) "
                                                         "where we may make cgroups")
MIB = 1 << 20


@pytest.fixture
def table(tmp_path):
    state_dir = tmp_path / "state"
    table = TaskTable(Layout(str(state_dir)))
    table.adopt()
    yield table
    table.launcher.close()
    kill_everything(str(state_dir))
    _remove_groups(cgroups.cgroup_name(table.layout.tasks_dir, ""))


@pytest.fixture
def workdir(tmp_path):
    path = tmp_path / "work"
    path.mkdir()
    return path


def _remove_groups(tag: str) -> None:
    for base in [*HOST.v1.values(), *([HOST.v2] if HOST.v2 else [])]:
        for name in os.listdir(base):
            if name.startswith(tag):
                group = cgroups.TaskCgroup(name, HOST)
                group.kill()
                group.remove()


def _groups(text: str) -> dict[str, str]:
    """/proc/PID/cgroup's lines as controller to cgroup path."""
    found = {}
    for line in text.splitlines():
        _, controllers, path = line.split(":", 2)
        for controller in controllers.split(","):
            found[controller] = path
    return found


def test_a_tasks_first_instruction_already_runs_in_all_its_groups(table, workdir):
    # cat is the task's program itself: what it prints is where the task was when its program began.
    keys = [TaskKey(f"g{os.getpid()}-{n}", 0, 0) for n in range(6)]
    for n, key in enumerate(keys):
        table.start(key, spec(workdir, ["cat", "/proc/self/cgroup"], cpus=0.5, memory_gib=0.25, pids_max=64,
                              gpu_indices=[0], gpu_uuids=["GPU-fake-0"], output=str(workdir / f"{n}.out")))
    for n, key in enumerate(keys):
        assert run_to_end(table, key).exit_code == 0
        where = _groups((workdir / f"{n}.out").read_text())
        name = cgroups.cgroup_name(table.layout.tasks_dir, key.dirname)
        for controller in HOST.v1:
            assert where[controller].endswith(f"/{cgroups.GROUP}/{name}"), (controller, where)


def _held_run(tmp_path, command: list[str], hold: threading.Event) -> TaskRun:
    """A task started by a TaskRun in this process, whose cgroup mover waits for ``hold`` before its moves."""
    confiner = cgroups.Confiner(HOST)
    confiner.later(hold.wait, urgent=True)
    workdir = tmp_path / "work"
    workdir.mkdir()
    key = TaskKey(f"h{os.getpid()}", 0, 0)
    task_dir = tmp_path / "state" / "tasks" / key.dirname
    task_dir.mkdir(parents=True)
    order = {"key": key.to_json(), "spec": spec(str(workdir), command, memory_gib=0.125).to_json(),
             "checkpoint_dir": str(tmp_path / "checkpoints")}
    run = TaskRun(str(task_dir), order, (os.getpid(), None), lambda key: None, confiner, cgspares.Spares())
    assert run.begin(), run.state.reason
    return run


def _end(run: TaskRun) -> None:
    """Reap the run's task as its supervisor would, and record its exit."""
    assert run.proc is not None
    status = os.waitpid(run.pid, 0)[1]
    run.proc.returncode = os.waitstatus_to_exitcode(status)
    run.leader_status = status
    wait_for(lambda: run.clean_up([]))
    run.finish()


@pytest.fixture
def held(tmp_path, monkeypatch):
    # A TaskRun in this process leaves it in "/" (it enters the workdir to check it, as its supervisor does):
    # monkeypatch puts the test session back where it was.
    monkeypatch.chdir(os.getcwd())
    hold = threading.Event()
    runs: list[TaskRun] = []
    yield hold, runs
    hold.set()
    for run in runs:
        if run.confiner is not None:
            run.confiner.close()
        if run.cgroup is not None:
            run.cgroup.kill()
            wait_for(run.cgroup.remove)


async def _run_inside(table: TaskTable, key: TaskKey, argv: list[str], run_root: str) -> tuple[bytes, dict]:
    """Run ``argv`` on a terminal inside the task as the node daemon does for ``gpuctl exec``/``attach``:
    its output and its ``pty_exit`` message."""
    sent: list[dict] = []
    done = asyncio.Event()

    async def send(message: dict) -> bool:
        sent.append(message)
        if message["type"] == "pty_exit":
            done.set()
        return True

    interactive = Interactive(table, run_root, send)
    await interactive.handle({"type": "pty_open", "session": "s1", "job": key.job, "task": key.task, "argv": argv})
    await asyncio.wait_for(done.wait(), 60)
    output = b"".join(base64.b64decode(m["data"]) for m in sent if m["type"] == "pty_out")
    return output, sent[-1]


def test_a_process_run_inside_a_task_at_its_gate_joins_all_the_tasks_groups(tmp_path, held):
    hold, runs = held
    run = _held_run(tmp_path, ["sleep", "60"], hold)
    runs.append(run)
    assert run.cgroup is not None
    table = TaskTable(Layout(str(tmp_path / "state")))
    try:
        table.adopt()
        with open(f"/proc/{run.pid}/cgroup") as f:
            task_now = _groups(f.read())
        # Still at its gate: in its v2 group alone, not yet in its v1 ones.
        assert not task_now["memory"].endswith(f"/{run.cgroup.name}"), task_now
        output, ended = asyncio.run(_run_inside(table, run.key, ["cat", "/proc/self/cgroup"], str(tmp_path / "run")))
    finally:
        table.launcher.close()
    assert ended["code"] == 0, (ended, output)
    where = _groups(output.decode().replace("\r\n", "\n"))
    for controller in ("memory", "pids", ""):
        assert where[controller].endswith(f"/{cgroups.GROUP}/{run.cgroup.name}"), (controller, where)


def test_a_task_stopped_while_at_its_gate_ends_without_running_its_program(tmp_path, held):
    hold, runs = held
    marker = tmp_path / "ran"
    run = _held_run(tmp_path, ["touch", str(marker)], hold)
    runs.append(run)
    (tmp_path / "state" / "tasks" / run.key.dirname / STOP_FILE).write_text("{}")
    run.look_at_stop_request()
    _end(run)
    hold.set()
    run.confiner.close()  # the worker's moves and release find the task gone
    assert run.state.term_signal == signal.SIGTERM and run.state.reason == "stopped", run.state
    assert not marker.exists()


def test_a_task_whose_move_into_a_group_fails_never_runs_and_fails_to_start(tmp_path, held):
    hold, runs = held
    marker = tmp_path / "ran"
    run = _held_run(tmp_path, ["touch", str(marker)], hold)
    runs.append(run)
    assert run.cgroup is not None
    os.rmdir(run.cgroup.v1["memory"])  # still empty: the task waits at its gate in its v2 group
    hold.set()
    _end(run)
    assert run.state.exit_code == gate.REFUSED_EXIT
    assert run.state.reason == "failed to start: cannot move the task into its cgroups: No such file or directory"
    assert not marker.exists()


def test_a_missing_program_fails_to_start_before_its_gate(table, workdir):
    key = TaskKey(f"n{os.getpid()}", 0, 0)
    table.start(key, spec(workdir, ["no-such-program-gpud"]))
    state = run_to_end(table, key)
    assert state.reason == "failed to start: cannot run no-such-program-gpud: No such file or directory"
    (workdir / "plain").write_text("echo hi\n")
    key = TaskKey(f"x{os.getpid()}", 0, 0)
    table.start(key, spec(workdir, ["./plain"]))
    assert run_to_end(table, key).reason == "failed to start: cannot run ./plain: Permission denied"


@pytest.mark.skipif("memory" not in HOST.enforced(), reason="the host has no writable memory cgroup")
def test_what_a_task_allocates_at_once_is_charged_to_its_memory_group(table, workdir):
    # dd's first act is to fill a 100 MiB buffer: all of it counts in the task's peak memory, none elsewhere.
    key = TaskKey(f"p{os.getpid()}", 0, 0)
    table.start(key, spec(workdir, ["dd", "if=/dev/zero", "of=/dev/null", "bs=100M", "count=1"], memory_gib=0.25))
    state = run_to_end(table, key, timeout=60)
    assert state.exit_code == 0, state
    assert state.max_rss_bytes is not None and state.max_rss_bytes >= 100 * MIB, state.max_rss_bytes
