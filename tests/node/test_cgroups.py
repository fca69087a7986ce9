"""Tasks in real cgroups: memory limit and OOM, CPUs, GPU devices, usage, and no process left behind.

Runs where the host lets us make cgroups (root, a writable cgroup v1 or v2
hierarchy); every cgroup a test makes is gone when it ends.
"""

from __future__ import annotations

import errno
import os
import signal
import subprocess
import sys
import textwrap
import uuid

import pytest

from gpud.node import cgroups, devfilter, procs
from gpud.node.spec import TaskKey
from gpud.node.taskstate import Layout, read_state
from gpud.node.tasks import TaskTable
from gpud.wire.task import ExitCause
from node_helpers import kill_everything, run_to_end, running, spec, wait_for
from programs import until_exists

HOST = cgroups.detect()
pytestmark = pytest.mark.skipif(not HOST.tracked(), reason="this host lets us make no cgroup (not root, or none "
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
    for path in _task_cgroups(table):
        group = cgroups.TaskCgroup(os.path.basename(path), HOST)
        group.kill()
        group.remove()


@pytest.fixture
def workdir(tmp_path):
    path = tmp_path / "work"
    path.mkdir()
    return path


def _task_cgroups(table: TaskTable, dirname: str = "") -> list[str]:
    """Every cgroup directory of this table's tasks (of the task with directory ``dirname``) that exists now,
    spares too when no task is named."""
    tag = cgroups.cgroup_name(table.layout.tasks_dir, dirname)
    found = []
    for base in [*HOST.v1.values(), *([HOST.v2] if HOST.v2 else [])]:
        found += [os.path.join(base, name) for name in os.listdir(base) if name.startswith(tag)]
    return found


def _marked(marker: str) -> list[int]:
    """Living processes whose command line holds ``marker``."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                argv = f.read()
        except OSError:
            continue
        if marker.encode() in argv and procs.same_process(int(entry), None) and int(entry) != os.getpid():
            found.append(int(entry))
    return found


def _escaping_script(marker: str) -> str:
    """A task whose children leave its process group every way they can, each naming ``marker`` in its argv."""
    sleeper = f"{sys.executable} -c 'import signal; signal.pause()'"
    return f"""#!/bin/sh
setsid {sleeper} {marker}-setsid &
( {sleeper} {marker}-double-fork & ) &
env -i {sleeper} {marker}-env-i &
nohup {sleeper} {marker}-nohup >/dev/null 2>&1 &
setsid sh -c 'while true; do {sys.executable} -c "import signal; signal.pause()" {marker}-respawned; done' \\
    {marker}-respawner &
exec sleep 600
"""


def _start_escapers(table: TaskTable, workdir, key: TaskKey) -> str:
    marker = f"gpud-escape-{uuid.uuid4().hex[:12]}"
    table.start(key, spec(workdir, script=_escaping_script(marker), grace_s=0.5))
    running(table, key)
    wait_for(lambda: len(_marked(marker)) >= 6, timeout=30)  # five escapers and the respawned child
    return marker


def test_stopping_a_task_kills_every_process_that_left_its_process_group(table, workdir):
    key = TaskKey(f"e{os.getpid()}", 0, 0)
    marker = _start_escapers(table, workdir, key)
    with open(os.path.join(table.layout.task_dir(key), "cgroups")) as f:
        groups = f.read().split()
    assert len(groups) >= 3 and all(os.path.basename(g) == cgroups.cgroup_name(table.layout.tasks_dir, key.dirname)
                                    for g in groups)
    for group in groups:  # every one of them is in each of the task's cgroups, however it left the group
        with open(os.path.join(group, "cgroup.procs")) as f:
            members = {int(line) for line in f}
        assert set(_marked(marker)) <= members, group
    table.stop(key, "cancelled")
    state = run_to_end(table, key, timeout=20)
    assert state.reason == "stopped"
    assert _marked(marker) == [], "0 processes left"
    # Removed (or, empty, renamed to a spare for the next task) just after the end is reported.
    wait_for(lambda: _task_cgroups(table, key.dirname) == [])


# Blocks its stop signal, a real-time one: each sending of it is queued, so the count of those queued is how many
# times it was sent. The leader starts a child that leaves its process group; each writes what it heard once told.
COUNT_STOP_SIGNALS = """import os, signal, subprocess, sys
name = sys.argv[1]
signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGRTMIN})
if name == "leader":
    subprocess.Popen([sys.executable, "-c", sys.argv[2], "escaped"], start_new_session=True)
open("ready-" + name, "w").close()
""" + until_exists("go") + """heard = 0
while signal.sigtimedwait([signal.SIGRTMIN], 0) is not None:
    heard += 1
open("heard-" + name, "w").write(str(heard))
if name == "leader":
""" + textwrap.indent(until_exists("heard-escaped"), "    ")


def test_every_process_of_a_stopped_task_hears_its_stop_signal_once(table, workdir):
    # A second stop signal may cut a job's handler short: many take it to mean "quit now, skip the checkpoint".
    key = TaskKey(f"s{os.getpid()}", 0, 0)
    table.start(key, spec(workdir, [sys.executable, "-c", COUNT_STOP_SIGNALS, "leader", COUNT_STOP_SIGNALS],
                          stop_signal="RTMIN"))
    running(table, key)
    wait_for(lambda: (workdir / "ready-leader").exists() and (workdir / "ready-escaped").exists())
    table.stop(key, "cancelled", grace_s=30)
    # A start order behind the stop in the supervisor's feed: once it has run, every stop signal has been sent.
    marker = TaskKey(f"s{os.getpid()}", 1, 0)
    table.start(marker, spec(workdir, ["true"]))
    assert run_to_end(table, marker).exit_code == 0
    (workdir / "go").write_text("")
    state = run_to_end(table, key)
    assert (state.exit_code, state.reason) == (0, "stopped")
    assert (workdir / "heard-leader").read_text() == "1", "the task's process group heard it once"
    assert (workdir / "heard-escaped").read_text() == "1", "a process that left the group heard it once too"


def test_a_killed_supervisors_task_is_killed_whole_through_its_cgroups(table, workdir):
    key = TaskKey(f"k{os.getpid()}", 0, 0)
    marker = _start_escapers(table, workdir, key)
    supervisor = read_state(table.layout.task_dir(key)).supervisor_pid
    os.kill(supervisor, signal.SIGKILL)
    wait_for(lambda: not procs.same_process(supervisor, None))
    # The daemon finds the supervisor gone and kills everything in the task's cgroups.
    wait_for(lambda: (table.refresh(), not _marked(marker))[1], timeout=20)
    assert _marked(marker) == []
    wait_for(lambda: (table.refresh(), table.get(key).state == "exited")[1])
    assert table.get(key).reason == "supervisor lost"
    assert _task_cgroups(table) == [], "the task's cgroups are removed"


@pytest.mark.skipif("memory" not in HOST.enforced(), reason="the host has no writable memory cgroup")
def test_a_task_over_its_memory_limit_is_killed_and_says_out_of_memory(table, workdir):
    key = TaskKey(f"m{os.getpid()}", 0, 0)
    hog = "b = bytearray(800 * 2**20)\nfor i in range(0, len(b), 4096): b[i] = 1\nprint('survived')"
    table.start(key, spec(workdir, [sys.executable, "-c", hog], memory_gib=200 / 1024))
    state = run_to_end(table, key, timeout=30)
    assert (state.term_signal, state.reason) == (signal.SIGKILL, "out of memory (limit 200M)")
    assert state.cause is ExitCause.OUT_OF_MEMORY
    assert "survived" not in (workdir / f"gpud-{key.job}.out").read_text()
    assert state.max_rss_bytes is not None and 150 * MIB < state.max_rss_bytes <= 200 * MIB


def test_a_task_records_its_peak_memory_and_cpu_time(table, workdir):
    key = TaskKey(f"u{os.getpid()}", 0, 0)
    work = "b = bytearray(60 * 2**20)\nfor i in range(0, len(b), 4096): b[i] = 1\nx = 0\nfor i in range(3_000_000): x += i"
    table.start(key, spec(workdir, [sys.executable, "-c", work], memory_gib=1.0))
    state = run_to_end(table, key, timeout=60)
    assert state.exit_code == 0
    assert state.max_rss_bytes is not None and state.max_rss_bytes >= 60 * MIB
    assert state.cpu_s is not None and 0.05 < state.cpu_s < 60
    report = state.report()
    assert report["max_rss_bytes"] == state.max_rss_bytes and report["cpu_s"] == round(state.cpu_s, 3)


@pytest.mark.skipif("cpuset" not in HOST.enforced() or "cpu" not in HOST.enforced(),
                    reason="the host has no writable cpu and cpuset cgroups")
def test_a_one_cpu_task_is_pinned_to_one_cpu_with_a_one_cpu_quota(table, workdir):
    key = TaskKey(f"c{os.getpid()}", 0, 0)
    show = ("import os\nprint(sorted(os.sched_getaffinity(0)))\n"
            "print(open('/proc/self/cgroup').read())")
    table.start(key, spec(workdir, [sys.executable, "-c", show], cpus=1.0))
    assert run_to_end(table, key).exit_code == 0
    out = (workdir / f"gpud-{key.job}.out").read_text()
    assert len(eval(out.splitlines()[0])) == 1
    assert cgroups.cgroup_name(table.layout.tasks_dir, key.dirname) in out


@pytest.mark.skipif("devices" not in HOST.enforced(), reason="the host has no writable devices cgroup")
def test_a_task_opens_only_its_own_gpu_devices(table, workdir, tmp_path):
    # Device nodes of the NVIDIA major for GPUs 0 and 1: with no driver here, a device the cgroup allows fails
    # to open with ENXIO or ENODEV (the driver is missing), one it denies with EPERM (the cgroup said no).
    devices = tmp_path / "dev"
    devices.mkdir()
    try:
        for minor in (0, 1):
            os.mknod(devices / f"nvidia{minor}", 0o666 | 0o020000, os.makedev(cgroups.NVIDIA_MAJOR, minor))
    except OSError as exc:
        pytest.skip(f"cannot make device nodes here: {exc.strerror}")
    probe = ("import errno, os, sys\nfor path in sys.argv[1:]:\n"
             "    try:\n        os.close(os.open(path, os.O_RDWR))\n        print('opened')\n"
             "    except OSError as exc:\n        print(errno.errorcode[exc.errno])\n")
    key = TaskKey(f"d{os.getpid()}", 0, 0)
    table.start(key, spec(workdir, [sys.executable, "-c", probe, str(devices / "nvidia0"), str(devices / "nvidia1")],
                          gpu_uuids=["GPU-fake-1"], gpu_indices=[1]))
    assert run_to_end(table, key).exit_code == 0
    other, own = (workdir / f"gpud-{key.job}.out").read_text().split()
    assert other == errno.errorcode[errno.EPERM]
    assert own in (errno.errorcode[errno.ENXIO], errno.errorcode[errno.ENODEV], "opened")


# Where a v2 group can be made for the device program: the task groups' v2 directory on a pure v2 host, else a
# hybrid host's v2 mount (its tasks use the v1 devices controller, but the device program works there all the same).
HYBRID_V2 = os.path.join(cgroups.ROOT, "unified")
V2_BASE = HOST.v2 or (os.path.join(HYBRID_V2, cgroups.GROUP) if HOST.v1 and os.access(HYBRID_V2, os.W_OK)
                      and os.path.exists(os.path.join(HYBRID_V2, "cgroup.procs")) else None)


@pytest.mark.skipif(V2_BASE is None or not devfilter.usable(), reason="no cgroup v2 mount, or no eBPF device programs")
@pytest.mark.parametrize("gpu_minors", [(1,), ()])
def test_on_cgroup_v2_a_device_program_lets_a_task_open_only_its_own_gpus(tmp_path, gpu_minors):
    # The pure-v2 path (no devices controller), on this host's v2 mount: the same probe as above, the task's
    # cgroup made as a host without a v1 devices controller makes it.
    assert V2_BASE is not None
    os.makedirs(V2_BASE, exist_ok=True)
    devices = tmp_path / "dev"
    devices.mkdir()
    try:
        for name, minor in (("nvidia0", 0), ("nvidia1", 1), ("nvidiactl", cgroups.NVIDIACTL_MINOR)):
            os.mknod(devices / name, 0o666 | 0o020000, os.makedev(cgroups.NVIDIA_MAJOR, minor))
    except OSError as exc:
        pytest.skip(f"cannot make device nodes here: {exc.strerror}")
    group = cgroups.TaskCgroup(f"devtest-{uuid.uuid4().hex[:8]}",
                               cgroups.Hierarchies(v2=V2_BASE, device_programs=True))
    group.create(cgroups.Limits(gpu_minors=gpu_minors))
    probe = ("import errno, os, sys\nfor path in sys.argv[1:]:\n"
             "    try:\n        os.close(os.open(path, os.O_RDWR))\n        print('opened')\n"
             "    except OSError as exc:\n        print(errno.errorcode[exc.errno])\n")
    try:
        done = subprocess.run([sys.executable, "-c", probe, *(str(devices / n) for n in ("nvidia0", "nvidia1",
                                                                                        "nvidiactl", "/dev/null"))],
                              preexec_fn=lambda: group.enter(os.getpid()), capture_output=True, text=True, timeout=30)
    finally:
        group.remove()
    other, own, control, null = done.stdout.split()
    denied, no_driver = errno.errorcode[errno.EPERM], (errno.errorcode[errno.ENXIO], errno.errorcode[errno.ENODEV])
    assert other == denied
    assert (own in no_driver and control in no_driver) if gpu_minors else (own == control == denied)
    assert null == "opened", "other devices are left alone"


@pytest.mark.skipif("cpuset" not in HOST.enforced() or len(os.sched_getaffinity(0)) < 2,
                    reason="the host has no writable cpuset cgroup or a single CPU")
def test_a_task_is_pinned_near_its_gpus_when_the_topology_is_known(table, workdir):
    far, near = sorted(os.sched_getaffinity(0))[0], sorted(os.sched_getaffinity(0))[-1]
    show = "import os\nprint(sorted(os.sched_getaffinity(0)))\n"
    # The least-used CPU would be the first one; its GPU's CPU is the last one.
    key = TaskKey(f"n{os.getpid()}", 0, 0)
    table.start(key, spec(workdir, [sys.executable, "-c", show], cpus=1.0, gpu_indices=[1], near_cpus=[near]))
    assert run_to_end(table, key).exit_code == 0
    assert (workdir / f"gpud-{key.job}.out").read_text().split("\n")[0] == str([near])
    key = TaskKey(f"f{os.getpid()}", 0, 0)
    table.start(key, spec(workdir, [sys.executable, "-c", show], cpus=1.0))
    assert run_to_end(table, key).exit_code == 0
    assert (workdir / f"gpud-{key.job}.out").read_text().split("\n")[0] == str([far])


@pytest.mark.skipif(not os.access("/sys/fs/cgroup/pids/cgroup.procs", os.W_OK) and "pids" not in HOST.enforced(),
                    reason="the host has no writable pids cgroup")
def test_a_task_is_counted_in_its_pids_cgroup_and_capped_when_its_spec_says(table, workdir):
    assert "pids" in cgroups.limits_report(HOST)["enforced"]
    # It starts 6 sleepers and says how many it could start, and what its pids group counted.
    probe = ("import os, subprocess, sys, time\nstarted = []\n"
             "for _ in range(6):\n"
             "    try:\n        started.append(subprocess.Popen(['sleep', '30']))\n"
             "    except OSError:\n        pass\n"
             "group = [line.split(':')[2] for line in open('/proc/self/cgroup').read().splitlines()"
             " if line.split(':')[1] == 'pids'][0]\n"
             "print(len(started), open('/sys/fs/cgroup/pids' + group + '/pids.current').read().strip(), group)\n"
             "for p in started: p.kill()\n")
    for job, pids_max, started in (("p", None, 6), ("q", 4, 3)):
        key = TaskKey(f"{job}{os.getpid()}", 0, 0)
        table.start(key, spec(workdir, [sys.executable, "-c", probe], pids_max=pids_max))
        assert run_to_end(table, key).exit_code == 0
        count, current, group = (workdir / f"gpud-{key.job}.out").read_text().split()
        assert group.endswith(cgroups.cgroup_name(table.layout.tasks_dir, key.dirname))
        assert (int(count), int(current)) == (started, started + 1), (job, count, current)
