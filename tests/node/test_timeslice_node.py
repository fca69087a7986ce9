"""Time-slicing through the node daemon: start orders with a compute share, stops of frozen tasks, the fail-safe
thaw when the daemon dies, and the GPU memory watchdog (fake GPUs)."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import time

import pytest

from gpud import hookimpl
from gpud.gpu.fake import FakeBackend, fake_uuid
from gpud.node.agent import NodeAgent
from gpud.node.config import NodeConfig
from gpud.node.spec import TaskSpec
from gpud.node.freezer import freezer_for, freezer_root, task_cgroup
from node_helpers import freezer_group_removed, kill_everything
from node_helpers import spec_json as spec  # the start orders carry the spec as JSON
from test_node_link import KEY, controller, start_daemon, stop_daemon  # noqa: F401 - controller is a fixture
from programs import until_exists
from waiting import observe, poll, until

SPIN = [sys.executable, "-c", "while True: pass"]
# Says when its handler is in place (a stop before that would end it by SIGTERM, not by its handler).
TRAP = [sys.executable, "-c", "import signal, sys\nsignal.signal(signal.SIGTERM, lambda *a: sys.exit(7))\n"
                              "open('trap-ready', 'w').close()\nwhile True: pass\n"]


FROZEN = ("T", "D")  # SIGSTOP shows as T; the cgroup freezer (here as root) as D


def sliced(workdir, command, request=0.5, limit=0.5, mode="strict", **fields):
    return spec(workdir, command, gpu_indices=[0], gpu_share=request, project="p",
                time_slicing={"mode": mode, "lease_ms": 50, "precision": 0.1, "request": request, "limit": limit},
                **fields)


def proc_state(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/stat") as f:
            data = f.read()
    except OSError:
        return "gone"
    return data[data.rfind(")") + 2]


def seen_states(pid: int, seconds: float) -> set[str]:
    return set(observe(lambda: proc_state(pid), seconds))


async def wait_until(predicate, timeout: float = 10.0):
    return await until(predicate, str(predicate), timeout)


@pytest.fixture
def state_dir(tmp_path):
    path = tmp_path / "state"
    yield path
    kill_everything(str(path))
    remove_cgroups(path)


def remove_cgroups(state_dir) -> None:
    """Remove the freezer cgroups of tasks whose supervisors were killed before they could."""
    tasks = state_dir / "tasks"
    deadline = time.monotonic() + 5
    for task_dir in tasks.iterdir() if tasks.is_dir() else ():
        poll(lambda: freezer_group_removed(str(task_dir)), max(0.0, deadline - time.monotonic()))


@pytest.fixture
def workdir(tmp_path):
    path = tmp_path / "work"
    path.mkdir()
    return path


def make_agent(controller, state_dir) -> NodeAgent:
    config = NodeConfig(controller_url=controller.url, cluster_key=KEY, state_dir=str(state_dir), name="n1",
                        gpu_backend="fake", fake_gpus=2, poll_s=0.1, reconnect_max_s=0.5)
    return NodeAgent(config, FakeBackend("n1", 2, str(state_dir)))


@pytest.fixture
async def agent(controller, state_dir):
    node = make_agent(controller, state_dir)
    await node.start()
    yield node
    await node.stop()


async def report_of(controller, job: str, state: str, timeout: float = 15.0) -> dict:
    """The task's report in ``state``, from a task message or a heartbeat, whichever carries it first."""
    async def find():
        while True:
            message = await controller.messages.get()
            reports = [message] if message["type"] == "task" else message.get("tasks", [])
            for report in reports:
                if report["job"] == job and report["state"] == state and report.get("pid"):
                    return report
    return await asyncio.wait_for(find(), timeout)


async def start(controller, job: str, the_spec: dict) -> dict:
    """Start a task and return its running report."""
    await controller.send({"type": "start", "job": job, "task": 0, "attempt": 0, "spec": the_spec})
    return await report_of(controller, job, "running")


async def test_two_tasks_sharing_a_gpu_take_turns_and_a_frozen_one_stops_on_term(agent, controller, workdir):
    await controller.next("register")
    a = await start(controller, "70", sliced(workdir, TRAP))
    b = await start(controller, "71", sliced(workdir, SPIN))
    await wait_until(lambda: 0 in agent.slices.slicers and len(agent.slices.slicers[0].members()) == 2)
    states = seen_states(a["pid"], 1.0)
    assert states & set(FROZEN) and "R" in states, states
    # Sliced, the interpreter may take a while to reach its handler on a busy machine.
    await wait_until(lambda: (workdir / "trap-ready").exists(), timeout=30)
    await controller.send({"type": "stop", "job": "70", "task": 0, "attempt": 0, "reason": "cancelled",
                           "grace_s": 30})
    exited = await report_of(controller, "70", "exited", timeout=10)
    assert exited["exit_code"] == 7  # it handled SIGTERM: it was thawed first, not killed after the grace
    await wait_until(lambda: [m.key for m in agent.slices.slicers[0].members()] == ["71.0.0"])
    # Alone with 50 % in strict mode it is still sliced: it runs half of each plan, and is frozen the other half.
    states = seen_states(b["pid"], 1.0)
    assert states & {"R", "S"} and states & set(FROZEN), states


async def test_a_lone_fair_task_is_never_frozen(agent, controller, workdir):
    await controller.next("register")
    a = await start(controller, "72", sliced(workdir, SPIN, 0.5, 1.0, mode="fair"))
    await wait_until(lambda: 0 in agent.slices.slicers)
    assert not seen_states(a["pid"], 0.5) & set(FROZEN)


async def test_stopping_the_daemon_thaws_every_task(controller, state_dir, workdir):
    node = make_agent(controller, state_dir)
    await node.start()
    await controller.next("register")
    a = await start(controller, "73", sliced(workdir, SPIN))
    b = await start(controller, "74", sliced(workdir, SPIN))
    await wait_until(lambda: {proc_state(a["pid"]), proc_state(b["pid"])} & set(FROZEN))
    await node.stop()
    assert proc_state(a["pid"]) in "RS" and proc_state(b["pid"]) in "RS"


async def test_a_restarted_daemon_thaws_what_it_adopts(controller, state_dir, workdir):
    node = make_agent(controller, state_dir)
    await node.start()
    await controller.next("register")
    a = await start(controller, "75", sliced(workdir, SPIN))
    await node.stop()
    freezer_for(str(state_dir / "tasks" / "75.0.0"), a["pid"]).freeze()  # as a daemon killed mid-plan would
    time.sleep(0.1)
    node = make_agent(controller, state_dir)
    await node.start()
    try:
        assert proc_state(a["pid"]) in "RS"
    finally:
        await node.stop()


@pytest.mark.parametrize("freezer", ["signal", "host"])
async def test_no_task_stays_frozen_after_kill_9_of_the_daemon(controller, state_dir, workdir, tmp_path, freezer,
                                                               monkeypatch):
    if freezer == "signal":
        monkeypatch.setenv("GPUD_FREEZER", "signal")
    key_file = tmp_path / "cluster.key"
    key_file.write_text(KEY)
    daemon = start_daemon(controller, state_dir, key_file)
    try:
        await controller.next("register")
        a = await start(controller, "76", sliced(workdir, SPIN))
        b = await start(controller, "77", sliced(workdir, SPIN))
        pids = [a["pid"], b["pid"]]
        await wait_until(lambda: {proc_state(p) for p in pids} & set(FROZEN))
        poll(lambda: {proc_state(p) for p in pids} & set(FROZEN), 0.5, 0.005)  # kill it while one is frozen
        os.kill(daemon.pid, signal.SIGKILL)
        daemon.wait()
        await wait_until(lambda: all(proc_state(p) in "RS" for p in pids), timeout=8)
        time.sleep(0.3)
        assert all(proc_state(p) in "RS" for p in pids)
        cgroups = [task_cgroup(str(state_dir / "tasks" / name)) for name in ("76.0.0", "77.0.0")]
        assert (cgroups == [None, None]) == (freezer == "signal" or freezer_root() is None)
    finally:
        stop_daemon(daemon)


def holding(workdir, first_gib: float, then_gib: float) -> list[str]:
    """A task that holds ``first_gib`` of fake GPU memory, then ``then_gib`` once the file ``grow`` appears."""
    return [sys.executable, "-c",
            "import os, time\n"
            "fd = os.memfd_create('fake-gpu-mem')  # what fake GPUs count as the process's GPU memory\n"
            f"os.ftruncate(fd, int({first_gib} * 2**30))\n"
            + until_exists(str(workdir / "grow")) +
            f"os.ftruncate(fd, int({then_gib} * 2**30))\n"
            "while True: pass\n"]


def on_fake_gpu(index: int) -> list[str]:
    return [fake_uuid("n1", index)]


async def test_a_task_over_its_memory_slice_is_warned_then_stopped(agent, controller, workdir, state_dir):
    await controller.next("register")
    the_spec = spec(workdir, holding(workdir, 1.05, 2.0), gpu_indices=[0], gpu_uuids=on_fake_gpu(0),
                    gpu_share=0.25, memory_slice={"limit_mib": 1024, "fraction": 0.25, "tolerance": 0.1,
                                                  "grace_s": 0.3})
    a = await start(controller, "78", the_spec)
    await wait_until(lambda: any(p.memory_gib > 1 for p in agent.backend.processes() if p.pid == a["pid"]))
    await asyncio.sleep(1.0)  # past the grace, within the tolerance
    assert proc_state(a["pid"]) in "RS"
    (workdir / "grow").write_text("")
    exited = await report_of(controller, "78", "exited", timeout=10)
    assert exited["reason"].startswith("gpu memory: used 2.0 GiB, over its slice of 1.0 GiB")


async def test_an_advisory_memory_slice_only_warns(agent, controller, workdir, state_dir, caplog):
    await controller.next("register")
    (workdir / "grow").write_text("")
    the_spec = spec(workdir, holding(workdir, 3.0, 3.0), gpu_indices=[0], gpu_uuids=on_fake_gpu(0),
                    gpu_share=0.25, memory_slice={"limit_mib": 1024, "fraction": 0.25, "grace_s": 0.2,
                                                  "enforce": False})
    a = await start(controller, "79", the_spec)
    await wait_until(lambda: "not enforced" in caplog.text, timeout=5)
    assert proc_state(a["pid"]) in "RS"


class MpsLimit:
    """Stands in for a site's MPS plugin."""

    @hookimpl
    def gpud_memory_slice_env(self, gpu_uuid, limit_mib, fraction):
        return {"CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": f"{gpu_uuid}={int(limit_mib)}M"}


async def test_a_plugin_can_enforce_the_memory_slice_through_the_environment(agent, controller, workdir):
    agent.slices.pm.register(MpsLimit(), name="mps-test")
    await controller.next("register")
    show = [sys.executable, "-c", "import os; print(os.environ['CUDA_MPS_PINNED_DEVICE_MEM_LIMIT'], "
                                  "os.environ['GPUD_GPU_MEMORY_LIMIT_MIB'])"]
    the_spec = spec(workdir, show, gpu_indices=[0], gpu_uuids=["GPU-x"], gpu_share=0.25,
                    memory_slice={"limit_mib": 20480, "fraction": 0.25})
    await controller.send({"type": "start", "job": "80", "task": 0, "attempt": 0, "spec": the_spec})
    await report_of(controller, "80", "exited")
    assert (workdir / "gpud-80.out").read_text().split() == ["GPU-x=20480M", "20480"]


def test_a_frozen_task_whose_supervisor_died_is_thawed_and_killed(state_dir, workdir):
    from gpud.node.spec import TaskKey
    from gpud.node.taskstate import Layout
    from gpud.node.tasks import TaskTable
    from node_helpers import alive, run_to_end, running, wait_for
    table = TaskTable(Layout(str(state_dir)))
    table.adopt()
    key = TaskKey("81", 0, 0)
    table.start(key, TaskSpec.decode(sliced(workdir, SPIN)))
    state = running(table, key)
    wait_for(lambda: table.get(key).supervisor_pid)
    freezer_for(str(state_dir / "tasks" / "81.0.0"), state.pid).freeze()
    os.kill(table.get(key).supervisor_pid, signal.SIGKILL)
    assert run_to_end(table, key).reason == "supervisor lost"
    wait_for(lambda: not alive(state.pid), timeout=5)
    table.launcher.close()


def frozen_in_cgroup(task_dir) -> bool:
    """True when the task's own freezer cgroup says it is frozen (v1 ``freezer.state``, v2 ``cgroup.freeze``)."""
    path = task_cgroup(str(task_dir))
    if path is None:
        return False
    if os.path.exists(os.path.join(path, "cgroup.freeze")):
        with open(os.path.join(path, "cgroup.freeze")) as f:
            return f.read().strip() == "1"
    with open(os.path.join(path, "freezer.state")) as f:
        return f.read().strip() != "THAWED"


@pytest.mark.parametrize("dies", ["supervisor", "daemon and supervisor"])
async def test_a_frozen_task_is_thawed_by_the_last_survivor_or_else_by_the_next_start(
        controller, state_dir, workdir, tmp_path, dies):
    """Supervisor alone: the daemon (and its slicer) survive, thaw and kill. Both: no survivor, the next start does."""
    if freezer_root() is None:
        pytest.skip("no writable freezer cgroup on this host")
    from gpud.node.taskstate import read_state
    key_file = tmp_path / "cluster.key"
    key_file.write_text(KEY)
    daemon = start_daemon(controller, state_dir, key_file)
    try:
        await controller.next("register")
        a = await start(controller, "82", sliced(workdir, SPIN))
        b = await start(controller, "83", sliced(workdir, SPIN))
        dirs = {report["pid"]: state_dir / "tasks" / f"{report['job']}.0.0" for report in (a, b)}
        supervisors = {read_state(str(d)).supervisor_pid for d in dirs.values()}
        await wait_until(lambda: any(frozen_in_cgroup(d) for d in dirs.values()))
        if dies != "supervisor":
            os.kill(daemon.pid, signal.SIGKILL)  # the slicer dies with its daemon
        for pid in supervisors:
            os.kill(pid, signal.SIGKILL)
        if dies != "supervisor":
            daemon.wait()
            frozen = [pid for pid, d in dirs.items() if frozen_in_cgroup(d)]
            assert frozen, "the slicer had thawed both before it died; nothing to test"
            time.sleep(0.3)
            assert all(proc_state(pid) in FROZEN for pid in frozen)
            daemon = start_daemon(controller, state_dir, key_file)
            await controller.next("register")
        # Thawed first, so the kill of the unattended task takes effect, and nothing is left frozen or behind.
        await wait_until(lambda: all(proc_state(pid) in ("gone", "Z") for pid in dirs), timeout=10)
        for job in ("82", "83"):
            lost = await report_of(controller, job, "exited")
            assert lost["reason"] == "supervisor lost"
        await wait_until(lambda: all(task_cgroup(str(d)) is None for d in dirs.values()), timeout=5)
    finally:
        stop_daemon(daemon)
