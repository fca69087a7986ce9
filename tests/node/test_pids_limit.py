"""The pids limit a node reports as enforced holds: a task forking past it is refused more processes.

Every task's pids cgroup gets a ``pids.max``: the policy's
``task_pids_max`` (sent with each start order), else the default.
"""

from __future__ import annotations

import os
import sys

import pytest

from gpud.node import cgroups
from gpud.node.spec import TaskKey
from gpud.node.taskstate import Layout
from gpud.node.tasks import TaskTable
from gpud.policy_file import parse_policy
from gpud.task_defaults import DEFAULT_TASK_PIDS_MAX
from node_helpers import kill_everything, run_to_end, spec

HOST = cgroups.detect()
needs_pids = pytest.mark.skipif("pids" not in HOST.enforced(), reason="the host has no writable pids cgroup")

# Forks sleepers (each a process of the task) until a fork fails or 600 ran; prints how many it started,
# whether a fork was refused, and its pids group's pids.max. It waits first until the supervisor has moved
# it into its v1 pids group (done just after the start).
FORKER = """import subprocess, time
def pids_group():
    for line in open('/proc/self/cgroup').read().splitlines():
        _, controllers, path = line.split(':', 2)
        if 'pids' in controllers.split(','):
            return path
    return ''
deadline = time.time() + 30
while '/gpud/' not in pids_group() and time.time() < deadline:
    time.sleep(0.01)
started, refused = [], False
try:
    for _ in range(600):
        started.append(subprocess.Popen(['sleep', '60']))
except OSError:
    refused = True
limit = open('/sys/fs/cgroup/pids' + pids_group() + '/pids.max').read().strip()
print(len(started), refused, limit, flush=True)
for p in started:
    p.kill()
    p.wait()
"""


def test_a_start_order_without_a_pids_limit_gets_the_default():
    assert spec("/tmp", ["true"]).pids_max == DEFAULT_TASK_PIDS_MAX
    assert spec("/tmp", ["true"], pids_max=64).pids_max == 64


def test_the_policy_sets_the_task_pids_limit_and_refuses_a_silly_one():
    assert parse_policy({}, "p").task_pids_max == DEFAULT_TASK_PIDS_MAX
    assert parse_policy({"task_pids_max": 500}, "p").task_pids_max == 500
    with pytest.raises(Exception, match="task_pids_max"):
        parse_policy({"task_pids_max": 0}, "p")


@needs_pids
def test_a_task_forking_past_its_pids_limit_is_refused(tmp_path):
    workdir = tmp_path / "work"
    workdir.mkdir()
    table = TaskTable(Layout(str(tmp_path / "state")))
    table.adopt()
    try:
        for job, limit in (("d", None), ("q", 40)):
            key = TaskKey(f"{job}{os.getpid()}", 0, 0)
            fields = {} if limit is None else {"pids_max": limit}
            table.start(key, spec(workdir, [sys.executable, "-c", FORKER], **fields))
            assert run_to_end(table, key, timeout=60).exit_code == 0
            started, refused, written = (workdir / f"gpud-{key.job}.out").read_text().split()
            if limit is None:  # the default is written, and 600 processes stay well below it
                assert (int(started), refused, int(written)) == (600, "False", DEFAULT_TASK_PIDS_MAX)
            else:  # the task itself, its Python threads, the sleepers: never more than 40 at once
                assert refused == "True" and int(started) < limit and int(written) == limit, (started, refused)
    finally:
        table.launcher.close()
        kill_everything(str(tmp_path / "state"))
