"""Node-side task cost: N trivial tasks (`true`) through one node's task table and supervisor, W at a time.

What a task costs the node alone, without a controller: a node's
TaskTable (as the node daemon has it) starts `true` tasks, at most W at
once (one per fake GPU, each on its own GPU index), polls their state
files, and starts the next as soon as one has ended, until N have run.
With --cgroups both, runs with per-task cgroups on and off
(``GPUD_CGROUPS=off``) alternate, --repeat R of each, so both see the
same load; it prints each side's median wall time, the supervisor's CPU
per task (user and system, and how much of it on its main thread: with
cgroups, other threads fork the tasks inside their groups and keep the
groups of ended tasks as spares) and the median start-to-end time of a
task, and the ratio on / off. Each run has a fresh state directory on a tmpfs
and its own supervisor, which exits (removing its spare cgroups) before
the next run starts. Per-task cgroups need root.

    python bench/node_tasks.py [--tasks 300] [--width 8] [--cgroups on|off|both] [--repeat 5] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import pwd
import shutil
import signal
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from gpud.node import cgroups, procs  # noqa: E402
from gpud.node.spec import TaskKey, TaskSpec  # noqa: E402
from gpud.node.taskstate import EXITED, Layout  # noqa: E402
from gpud.node.tasks import TaskTable  # noqa: E402

TMPFS = "/dev/shm"
POLL_S = 0.001


def task_spec(workdir: str, gpu: int) -> TaskSpec:
    """A trivial task on GPU ``gpu``, run as this user, with the drain benchmark's small CPU and memory asks."""
    return TaskSpec.decode({"user": pwd.getpwuid(os.getuid()).pw_name, "allow_root": True, "workdir": workdir,
            "command": ["true"], "cpus": 0.1, "memory_gib": 0.1, "gpu_uuids": [f"GPU-fake-{gpu}"],
            "gpu_indices": [gpu]})


def stat_cpu(path: str) -> tuple[float, float] | None:
    """User and system CPU seconds so far of the process or thread whose /proc ``stat`` file is ``path``; None
    when it cannot be read."""
    try:
        with open(path) as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return None
    tick = os.sysconf("SC_CLK_TCK")
    return int(fields[11]) / tick, int(fields[12]) / tick


def supervisor_cpu() -> tuple[float, float]:
    """User and system CPU seconds so far of this process's children (the supervisor); (0, 0) off Linux."""
    user = system = 0.0
    try:
        with open(f"/proc/{os.getpid()}/task/{os.getpid()}/children") as f:
            kids = f.read().split()
    except OSError:
        return 0.0, 0.0
    for kid in kids:
        used = stat_cpu(f"/proc/{kid}/stat")
        if used is not None:
            user += used[0]
            system += used[1]
    return user, system


def main_thread_cpu(pid: int | None) -> float:
    """User plus system CPU seconds so far of process ``pid``'s main thread (its other threads fork the tasks into
    their cgroups and reset and keep the groups of tasks that ended); 0 when it cannot be read."""
    used = stat_cpu(f"/proc/{pid}/task/{pid}/stat") if pid is not None else None
    return sum(used) if used is not None else 0.0


def run(tasks: int, width: int, on: bool) -> dict:
    """Run ``tasks`` tasks, ``width`` at a time, with per-task cgroups on or off; returns the figures."""
    if on:
        os.environ.pop(cgroups.CGROUPS_ENV, None)
    else:
        os.environ[cgroups.CGROUPS_ENV] = "off"
    root = tempfile.mkdtemp(prefix="gpud-node-tasks-", dir=TMPFS if os.path.isdir(TMPFS) else None)
    workdir = tempfile.mkdtemp(prefix="gpud-node-tasks-")
    table = TaskTable(Layout(root))
    table.adopt()
    supervisor = None
    try:
        warm = TaskKey("warm", 0, 0)  # the supervisor starts (a Python process) before the clock does
        table.start(warm, task_spec(workdir, 0))
        while (state := table.get(warm)) is None or state.state != EXITED:
            time.sleep(POLL_S)
            table.refresh([warm])
        supervisor = state.supervisor_pid
        table.ack(warm)
        cpu_before, main_before = supervisor_cpu(), main_thread_cpu(supervisor)
        began = time.perf_counter()
        free, live, turns, started = list(range(width)), {}, [], 0
        while started < tasks or live:
            while started < tasks and free:
                key = TaskKey(f"t{started}", 0, 0)
                gpu = free.pop()
                table.start(key, task_spec(workdir, gpu))
                live[key] = (gpu, time.perf_counter())
                started += 1
            time.sleep(POLL_S)
            table.refresh(list(live))
            for key in list(live):
                state = table.get(key)
                if state is not None and state.state == EXITED:
                    if state.exit_code != 0:
                        raise SystemExit(f"task {key.dirname} ended with {state.exit_code} ({state.reason})")
                    gpu, at = live.pop(key)
                    free.append(gpu)
                    turns.append(time.perf_counter() - at)
                    table.ack(key)
        wall = time.perf_counter() - began
        cpu_after, main_after = supervisor_cpu(), main_thread_cpu(supervisor)
    finally:
        table.launcher.close()
        _wait_gone(supervisor)
        shutil.rmtree(root, ignore_errors=True)
        shutil.rmtree(workdir, ignore_errors=True)
    return {"cgroups": "on" if on else "off", "tasks": tasks, "width": width, "wall_s": round(wall, 3),
            "supervisor_user_ms_per_task": round((cpu_after[0] - cpu_before[0]) * 1000 / tasks, 3),
            "supervisor_sys_ms_per_task": round((cpu_after[1] - cpu_before[1]) * 1000 / tasks, 3),
            "supervisor_main_thread_ms_per_task": round((main_after - main_before) * 1000 / tasks, 3),
            "median_task_turnaround_ms": round(statistics.median(turns) * 1000, 2),
            "load_1m": round(os.getloadavg()[0], 2)}


def _wait_gone(pid: int | None) -> None:
    """Wait for the supervisor to finish its last task and exit; SIGKILL it by pid after 30 s."""
    deadline = time.monotonic() + 30
    while pid and procs.same_process(pid, None):
        if time.monotonic() > deadline:
            os.kill(pid, signal.SIGKILL)
            break
        time.sleep(0.01)
    try:
        while os.waitpid(-1, os.WNOHANG)[0] > 0:
            pass
    except ChildProcessError:
        pass


def median_side(runs: list[dict]) -> dict:
    """One side's median figures over its runs, with every run's wall time and load average."""
    keys = ("wall_s", "supervisor_user_ms_per_task", "supervisor_sys_ms_per_task",
            "supervisor_main_thread_ms_per_task", "median_task_turnaround_ms")
    out = {key: round(statistics.median(r[key] for r in runs), 3) for key in keys}
    out["wall_s_each"] = [r["wall_s"] for r in runs]
    out["load_1m_each"] = [r["load_1m"] for r in runs]
    return out


def main(argv: list[str] | None = None) -> int:
    """Parse the flags, run and print the figures."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tasks", type=int, default=300, help="tasks per run (default 300)")
    parser.add_argument("--width", type=int, default=8, help="tasks at once, one per fake GPU (default 8)")
    parser.add_argument("--cgroups", choices=("on", "off", "both"), default="both",
                        help="per-task cgroups on, off, or both in turn (default both)")
    parser.add_argument("--repeat", type=int, default=5, help="runs of each side (default 5)")
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    args = parser.parse_args(argv)
    if args.cgroups != "off" and not cgroups.detect().tracked():
        print("note: this host lets us make no cgroup (not root, or none writable): 'on' runs without them",
              file=sys.stderr)
    sides = {"both": (True, False), "on": (True,), "off": (False,)}[args.cgroups]
    runs: dict[bool, list[dict]] = {side: [] for side in sides}
    for _ in range(max(1, args.repeat)):
        for side in sides:
            runs[side].append(run(args.tasks, args.width, side))
    result = {"on" if side else "off": median_side(found) for side, found in runs.items()}
    if len(sides) == 2:
        result["wall_ratio"] = round(result["on"]["wall_s"] / result["off"]["wall_s"], 3)
    if args.json:
        print(json.dumps(result, indent=2))
        return 0
    print(f"node tasks: {args.tasks} `true` tasks, {args.width} at a time, {args.repeat} run(s) of each side")
    for name, side in result.items():
        if name == "wall_ratio":
            continue
        print(f"  cgroups {name}: median wall {side['wall_s']:.2f} s (each {', '.join(map(str, side['wall_s_each']))});"
              f" supervisor CPU per task {side['supervisor_user_ms_per_task']} user + "
              f"{side['supervisor_sys_ms_per_task']} system ms ({side['supervisor_main_thread_ms_per_task']} of them on"
              f" its main thread); task start to end median "
              f"{side['median_task_turnaround_ms']} ms; load average {', '.join(map(str, side['load_1m_each']))}")
    if "wall_ratio" in result:
        print(f"  on / off: {result['wall_ratio']} (target <= 1.1)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
