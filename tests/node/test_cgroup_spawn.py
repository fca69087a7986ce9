"""A task starts inside all its cgroup v1 groups: its first instruction already runs within its limits (real cgroups).

The supervisor forks each task from a thread of its own that has stepped
into the task's v1 groups (``gpud.node.cgspawn``). Had the task been moved
after it started, its first instructions would run unconfined, and in
cgroup v1 what it allocated then would stay charged elsewhere for good.
"""

from __future__ import annotations

import asyncio
import base64
import os
import threading

import pytest

from gpud.node import cgroups, cgspares, cgspawn
from gpud.node.pty_session import Interactive
from gpud.node.spec import TaskKey
from gpud.node.supervisor import TaskRun
from gpud.node.taskstate import Layout
from gpud.node.tasks import TaskTable
from node_helpers import kill_everything, run_to_end, running, spec, wait_for

HOST = cgroups.detect()
pytestmark = pytest.mark.skipif(not HOST.v1, reason="this host lets us make no cgroup v1 group (not root, or none "
                                                    "writable)")
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


@pytest.fixture
def made(monkeypatch):
    """Directories a test makes in the host's hierarchies, removed (deepest first) when it ends."""
    # A TaskRun in this process leaves it in "/" (it enters the workdir to check it, as its supervisor does):
    # monkeypatch puts the test session back where it was.
    monkeypatch.chdir(os.getcwd())
    paths: list[str] = []
    yield paths
    for path in reversed(paths):
        group = cgroups.TaskCgroup(os.path.basename(path), cgroups.Hierarchies(v1={"any": os.path.dirname(path)}))
        group.kill()
        wait_for(group.remove)


def _remove_groups(tag: str) -> None:
    for base in HOST.v1.values():
        for name in os.listdir(base):
            if name.startswith(tag):
                group = cgroups.TaskCgroup(name, cgroups.Hierarchies(v1={"any": base}))
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


def _made_for(name: str) -> dict[str, str]:
    """The task's groups by controller: those made for it (no cpu group for a task pinned to as many CPUs as
    it asked for)."""
    return {c: os.path.join(base, name) for c, base in HOST.v1.items() if os.path.isdir(os.path.join(base, name))}


def _thread_groups() -> dict[str, str]:
    with open(f"/proc/self/task/{threading.get_native_id()}/cgroup") as f:
        return _groups(f.read())


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


def test_a_running_tasks_groups_hold_the_task_alone_never_its_supervisor(table, workdir):
    key = TaskKey(f"s{os.getpid()}", 0, 0)
    table.start(key, spec(workdir, ["sleep", "60"], memory_gib=0.125))
    state = running(table, key)
    name = cgroups.cgroup_name(table.layout.tasks_dir, key.dirname)
    made = _made_for(name)
    assert {"memory", "pids"} <= set(made), made
    # The spawner thread that forked the task leaves its groups once it has handed the task over.
    for path in made.values():
        wait_for(lambda: _thread_ids(path) == [state.pid], timeout=5)
    assert state.supervisor_pid not in cgroups.TaskCgroup(name, HOST).pids()


def _thread_ids(group: str) -> list[int]:
    with open(os.path.join(group, "tasks")) as f:
        return [int(tid) for tid in f.read().split()]


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


def test_a_process_run_inside_a_task_joins_all_the_tasks_groups(table, workdir, tmp_path):
    key = TaskKey(f"e{os.getpid()}", 0, 0)
    table.start(key, spec(workdir, ["sleep", "60"], memory_gib=0.125))
    running(table, key)
    output, ended = asyncio.run(_run_inside(table, key, ["cat", "/proc/self/cgroup"], str(tmp_path / "run")))
    assert ended["code"] == 0, (ended, output)
    where = _groups(output.decode().replace("\r\n", "\n"))
    name = cgroups.cgroup_name(table.layout.tasks_dir, key.dirname)
    made = _made_for(name)
    assert {"memory", "pids"} <= set(made), made
    for controller in made:
        assert where[controller].endswith(f"/{cgroups.GROUP}/{name}"), (controller, where)


def _cpuset_without_cpus(made: list[str]) -> str:
    """A new v1 cpuset group with no CPUs: the kernel refuses every process and thread that would join it."""
    path = os.path.join(HOST.v1["cpuset"], f"nocpus-{os.getpid()}-{threading.get_native_id()}")
    os.mkdir(path)
    made.append(path)
    return path


@pytest.mark.skipif("cpuset" not in HOST.v1, reason="the host has no writable cpuset cgroup")
def test_a_task_whose_group_refuses_it_never_runs_and_fails_to_start(tmp_path, made):
    # Its cpuset group inherits no CPU from the group above it, so the kernel refuses the spawner thread.
    marker = tmp_path / "ran"
    hierarchies = cgroups.Hierarchies(v1={**HOST.v1, "cpuset": _cpuset_without_cpus(made)})
    confiner = cgroups.Confiner(hierarchies)
    workdir = tmp_path / "work"
    workdir.mkdir()
    key = TaskKey(f"r{os.getpid()}", 0, 0)
    task_dir = tmp_path / "state" / "tasks" / key.dirname
    task_dir.mkdir(parents=True)
    order = {"key": key.to_json(), "spec": spec(str(workdir), ["touch", str(marker)], memory_gib=0.125).to_json(),
             "checkpoint_dir": str(tmp_path / "checkpoints")}
    run = TaskRun(str(task_dir), order, (os.getpid(), None), lambda key: None, confiner, cgspares.Spares())
    try:
        assert not run.begin()
    finally:
        confiner.close()
    assert run.state.reason == "failed to start: cannot move the task into its cgroups: No space left on device"
    assert not marker.exists()
    name = cgroups.cgroup_name(str(tmp_path / "state" / "tasks"), key.dirname)
    assert not any(os.path.exists(os.path.join(base, name)) for base in hierarchies.v1.values()), \
        "the groups of a task that never started are removed"


@pytest.mark.skipif("cpuset" not in HOST.v1 or "pids" not in HOST.v1, reason="no writable cpuset and pids cgroups")
def test_the_spawner_thread_is_back_home_after_a_refusal_and_nothing_was_started(made):
    home = cgroups.own_cgroups(HOST)
    spawner = cgspawn.Spawner(home)
    pids_group = os.path.join(HOST.v1["pids"], f"spawn-{os.getpid()}")
    os.mkdir(pids_group)
    made.append(pids_group)
    started: list[dict] = []
    try:
        with pytest.raises(cgspawn.Refused, match="No space left on device"):
            spawner.spawn([pids_group, _cpuset_without_cpus(made)], lambda: started.append(_thread_groups()))
        assert started == []
        # The pids group it had joined before the refusal holds nothing now; the next spawn runs in its groups.
        assert open(os.path.join(pids_group, "tasks")).read() == ""
        where = spawner.spawn([pids_group], _thread_groups)
        assert where["pids"].endswith(f"/spawn-{os.getpid()}"), where
        spawner.wait_home()
        assert open(os.path.join(pids_group, "tasks")).read() == ""
    finally:
        spawner.close()


@pytest.mark.skipif("pids" not in HOST.v1, reason="no writable pids cgroup")
def test_once_the_spawner_is_home_again_it_is_in_no_group_of_the_tasks_it_started(made):
    # spawn returns the task as soon as it is forked; the thread goes back to the supervisor's groups after.
    pids_group = os.path.join(HOST.v1["pids"], f"home-{os.getpid()}")
    os.mkdir(pids_group)
    made.append(pids_group)
    spawner = cgspawn.Spawner(cgroups.own_cgroups(HOST))
    try:
        for _ in range(20):
            assert spawner.spawn([pids_group], threading.get_native_id) != threading.get_native_id()
            spawner.wait_home()
            assert _thread_ids(pids_group) == []
    finally:
        spawner.close()


def test_a_task_runs_at_the_niceness_and_policy_of_its_supervisor_not_of_the_thread_that_forked_it(table, workdir):
    # The spawner thread takes precedence over the tasks it forks (SCHED_RESET_ON_FORK, a lower niceness): none of
    # it may pass to a task. Fields 19 and 41 of /proc/PID/stat: the niceness and the scheduling policy.
    key = TaskKey(f"p{os.getpid()}", 0, 0)
    table.start(key, spec(workdir, ["cat", "/proc/self/stat"], cpus=0.5, memory_gib=0.25, output=str(workdir / "out")))
    assert run_to_end(table, key).exit_code == 0
    fields = (workdir / "out").read_text().rpartition(")")[2].split()
    niceness, policy = int(fields[19 - 3]), int(fields[41 - 3])
    assert (niceness, policy) == (max(0, os.getpriority(os.PRIO_PROCESS, 0)), os.SCHED_OTHER)


@pytest.mark.skipif("pids" not in HOST.v1, reason="no writable pids cgroup")
def test_a_spawner_thread_that_cannot_go_home_ends_and_leaves_the_group(made):
    pids_group = os.path.join(HOST.v1["pids"], f"stranded-{os.getpid()}")
    os.mkdir(pids_group)
    made.append(pids_group)
    # Its way home is a directory that is no group: the thread cannot go back, so it ends, leaving the group.
    spawner = cgspawn.Spawner({os.path.dirname(HOST.v1["pids"]): "/nonexistent-gpud-group"})
    try:
        where = spawner.spawn([pids_group], _thread_groups)
        assert where["pids"].endswith(f"/stranded-{os.getpid()}"), where
        wait_for(lambda: open(os.path.join(pids_group, "tasks")).read() == "")
        assert spawner.spawn([pids_group], lambda: "again") == "again"  # a new thread
    finally:
        spawner.close()


@pytest.mark.skipif("pids" not in HOST.v1, reason="no writable pids cgroup")
def test_the_process_starting_a_task_is_never_counted_among_its_processes(made, tmp_path):
    # While its spawner thread is inside, the group lists this process: neither the supervisor itself nor a fence
    # told which supervisor starts the task may count (and kill) it as one of the task's.
    base = os.path.join(HOST.v1["pids"], f"starter-{os.getpid()}")
    os.mkdir(base)
    made.append(base)
    name = "task"
    os.mkdir(os.path.join(base, name))
    made.append(os.path.join(base, name))
    (tmp_path / "cgroups").write_text(os.path.join(base, name) + "\n")
    spawner = cgspawn.Spawner(cgroups.own_cgroups(HOST))

    def look() -> tuple[str, list[int], list[int], list[int]]:
        with open(os.path.join(base, name, "cgroup.procs")) as f:
            listed = f.read()
        return (listed, cgroups.TaskCgroup(name, cgroups.Hierarchies(v1={"pids": base})).pids(),
                cgroups.recorded(str(tmp_path), supervisor=os.getpid()).pids(),  # type: ignore[union-attr]
                cgroups.TaskCgroup(name, cgroups.Hierarchies(v1={"pids": base}), starter=1).pids())

    try:
        listed, own, told, other = spawner.spawn([os.path.join(base, name)], look)
    finally:
        spawner.close()
    assert listed.split() == [str(os.getpid())]
    assert own == told == [], "never counted by the process itself, nor by one told it starts the task"
    assert other == [os.getpid()], "one not told counts it"


def test_a_missing_program_fails_to_start(table, workdir):
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
