"""The CPU limits a node reports as enforced hold against a task that tries to pass them.

(Memory, pids and GPU devices are broken on purpose in test_cgroups.py and
test_pids_limit.py.)
"""

from __future__ import annotations

import os
import sys

import pytest

from gpud.node import cgroups
from gpud.node.spec import TaskKey
from gpud.node.taskstate import Layout
from gpud.node.tasks import TaskTable
from node_helpers import kill_everything, run_to_end, spec

HOST = cgroups.detect()


@pytest.fixture
def node(tmp_path):
    table = TaskTable(Layout(str(tmp_path / "state")))
    table.adopt()
    workdir = tmp_path / "work"
    workdir.mkdir()
    yield table, workdir
    table.launcher.close()
    kill_everything(str(tmp_path / "state"))


# Spins (two threads, so a missing quota shows even on a busy host) for SPIN_S of wall time, then prints the
# CPU time it got and how often its cpu cgroup was throttled.
SPIN_S = 3.0
SPINNER = f"""import threading, time
def spin():
    end = time.time() + {SPIN_S}
    while time.time() < end:
        pass
threads = [threading.Thread(target=spin) for _ in range(2)]
for t in threads: t.start()
for t in threads: t.join()
group = [line.split(':', 2)[2] for line in open('/proc/self/cgroup').read().splitlines()
         if 'cpu' in line.split(':')[1].split(',')][0]
stat = dict(line.split() for line in open('/sys/fs/cgroup/cpu' + group + '/cpu.stat'))
print(time.process_time(), stat['nr_throttled'])
"""


@pytest.mark.skipif("cpu" not in HOST.v1, reason="the host has no writable cgroup v1 cpu hierarchy")
def test_a_task_spinning_past_its_cpu_quota_is_throttled_to_it(node):
    table, workdir = node
    key = TaskKey(f"q{os.getpid()}", 0, 0)
    table.start(key, spec(workdir, [sys.executable, "-c", SPINNER], cpus=0.05))
    assert run_to_end(table, key, timeout=60).exit_code == 0
    used, throttled = (workdir / f"gpud-{key.job}.out").read_text().split()
    # 5 % of one CPU over 3 s is 0.15 s; the interpreter's start comes on top.
    assert float(used) < 0.05 * SPIN_S + 0.35, f"it used {float(used):.2f} s of CPU"
    assert int(throttled) > 0


@pytest.mark.skipif("cpuset" not in HOST.enforced() or len(os.sched_getaffinity(0)) < 2,
                    reason="the host has no writable cpuset cgroup or a single CPU")
def test_a_task_cannot_widen_its_cpus_past_its_cpuset(node):
    table, workdir = node
    every = sorted(os.sched_getaffinity(0))
    probe = ("import os, sys\nbefore = sorted(os.sched_getaffinity(0))\n"
             "try:\n    os.sched_setaffinity(0, set(map(int, sys.argv[1:])))\nexcept OSError:\n    pass\n"
             "print(before, sorted(os.sched_getaffinity(0)))\n")
    key = TaskKey(f"w{os.getpid()}", 0, 0)
    table.start(key, spec(workdir, [sys.executable, "-c", probe, *map(str, every)], cpus=1.0))
    assert run_to_end(table, key).exit_code == 0
    before, after = (workdir / f"gpud-{key.job}.out").read_text().strip().split("] [")
    assert len(before.strip("[]").split(",")) == 1
    assert after.strip("[]") == before.strip("[]"), "asking for every CPU leaves it on its own"
