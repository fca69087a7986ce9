"""CPU-bound stand-in jobs for measuring time-slicing on a host without GPUs.

Each stand-in is a Python busy loop in a session of its own, pinned to one
core, so that a core plays the part of the GPU: what a stand-in gets of
the core (its run time in ``/proc/PID/schedstat``) is what a job would get
of the GPU. The bench (bench/timeslice.py) and the tests share this code.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from typing import Callable, Mapping, Sequence

from gpud.node.freezer import freezer_for, make_task_cgroup, remove_task_cgroup
from gpud.node.slicer import Plan
from gpud.node.slicerun import GpuSlicer, Member

SPIN = "while True:\n    pass\n"


def spawn(cpu: int) -> subprocess.Popen:
    """Start one busy-loop stand-in in its own session, pinned to ``cpu``."""
    proc = subprocess.Popen([sys.executable, "-S", "-c", SPIN], start_new_session=True,
                            stdin=subprocess.DEVNULL)
    os.sched_setaffinity(proc.pid, {cpu})
    return proc


def run_ns(pid: int) -> int:
    """Nanoseconds process ``pid`` has run on a CPU (0 when it is gone)."""
    try:
        with open(f"/proc/{pid}/schedstat") as f:
            return int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return 0


def run_time(member: Member) -> float:
    """Seconds the stand-in ``member`` has run: the meter that makes the slicer carry shortfalls of CPU time."""
    return run_ns(member.pgid) / 1e9


@dataclass(slots=True)
class PlanSample:
    """What each stand-in got of the core during one plan (seconds) and the plan's wall time."""

    shares: dict[str, float]
    got: dict[str, float]
    wall: float

    def measured(self) -> dict[str, float]:
        """Each stand-in's part of all the run time the stand-ins got in the plan."""
        total = sum(self.got.values()) or 1.0
        return {key: value / total for key, value in self.got.items()}

    def errors_pp(self) -> dict[str, float]:
        """Per stand-in, |measured part - deserved share| in percentage points (shares normalised to 1)."""
        total = sum(self.shares.values()) or 1.0
        measured = self.measured()
        return {key: abs(measured.get(key, 0.0) - share / total) * 100 for key, share in self.shares.items()}


@dataclass(slots=True)
class Recorder:
    """Samples every stand-in's run time at each plan start (called from the slicer's thread)."""

    pids: Mapping[str, int]
    each_plan: Callable[[int, Mapping[str, int]], None] | None = None
    marks: list[tuple[float, dict[str, int]]] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def __call__(self, plan: Plan) -> None:
        mark = (time.monotonic(), {key: run_ns(pid) for key, pid in self.pids.items()})
        with self.lock:
            self.marks.append(mark)
            count = len(self.marks)
        if self.each_plan is not None:
            self.each_plan(count, self.pids)

    def count(self) -> int:
        """How many plan starts were seen."""
        with self.lock:
            return len(self.marks)


def run_slicer(mode: str, requests: Mapping[str, tuple[float, float]], plans: int, *, lease_s: float,
               precision: float, warmup: int = 1, cpu: int | None = None, monitor=None,
               on_spawn: Callable[[dict[str, int]], None] | None = None, meter: str = "cpu",
               freezer: str = "signal", each_plan: Callable[[int, Mapping[str, int]], None] | None = None,
               timeout_s: float = 120.0) -> tuple[list[PlanSample], GpuSlicer]:
    """Slice stand-ins with ``requests`` (key -> (request, limit)) for ``warmup + plans`` plans; sample each.

    ``meter`` is "cpu" (the slicer carries shortfalls of run time, as it
    would of GPU time) or "wall" (of the time each held the core, what the
    node daemon does). ``on_spawn``, when given, is called with the
    stand-ins' pids before slicing starts (a test sets their fake GPU usage),
    ``each_plan`` with the plan's number and the pids as each plan starts.
    ``freezer`` is "signal" or "cgroup" (the host's freezer cgroups). Returns one sample per plan
    after the warm-up and the slicer (closed, its history kept).
    """
    cpu = max(os.sched_getaffinity(0)) if cpu is None else cpu
    procs = {key: spawn(cpu) for key in requests}
    if on_spawn is not None:
        on_spawn({key: p.pid for key, p in procs.items()})
    recorder = Recorder({key: p.pid for key, p in procs.items()}, each_plan)
    scratch = tempfile.mkdtemp(prefix="gpud-standins-")
    freezers = {}
    for key, p in procs.items():
        task_dir = os.path.join(scratch, key)
        os.mkdir(task_dir)
        if freezer == "cgroup" and make_task_cgroup(task_dir, f"standin-{p.pid}", p.pid) is None:
            raise RuntimeError("no writable cgroup freezer on this host")
        freezers[key] = (task_dir, freezer_for(task_dir, p.pid))
    slicer = GpuSlicer(0, mode, lease_s, precision, monitor=monitor, on_plan=recorder,
                       meter=run_time if meter == "cpu" else None)
    try:
        slicer.set_members([Member(key, freezers[key][0], p.pid, freezers[key][1], *requests[key])
                            for key, p in procs.items()])
        slicer.start()
        others = os.sched_getaffinity(0) - {cpu}
        if others and slicer.native_id is not None:
            os.sched_setaffinity(slicer.native_id, others)  # the switching thread must not steal the measured core
        deadline = time.monotonic() + timeout_s
        while recorder.count() < warmup + plans + 1 and time.monotonic() < deadline:
            time.sleep(0.02)
    finally:
        slicer.close()
        for p in procs.values():
            p.kill()
            p.wait()
        for task_dir, _ in freezers.values():
            remove_task_cgroup(task_dir)
        shutil.rmtree(scratch, ignore_errors=True)
    history = slicer.history
    samples = []
    marks = recorder.marks
    for i in range(warmup, min(len(marks) - 1, len(history))):
        (t0, a), (t1, b) = marks[i], marks[i + 1]
        samples.append(PlanSample(dict(history[i].shares), {k: (b[k] - a[k]) / 1e9 for k in a}, t1 - t0))
        if len(samples) == plans:
            break
    return samples, slicer


def summary(samples: Sequence[PlanSample]) -> dict[str, float]:
    """Per-plan worst error (max), the mean error over plans and stand-ins, and the core's busy part."""
    errors = [max(s.errors_pp().values()) for s in samples]
    every = [e for s in samples for e in s.errors_pp().values()]
    busy = sum(sum(s.got.values()) for s in samples) / (sum(s.wall for s in samples) or 1.0)
    return {"max_pp": max(errors, default=0.0), "mean_pp": sum(every) / (len(every) or 1),
            "mean_plan_max_pp": sum(errors) / (len(errors) or 1), "core_busy": busy}


def mean_error_pp(samples: Sequence[PlanSample]) -> float:
    """The worst stand-in's error of its part averaged over the plans, against its share (percentage points)."""
    if not samples:
        return float("inf")
    keys = samples[0].shares
    worst = 0.0
    for key in keys:
        got = sum(s.measured().get(key, 0.0) for s in samples) / len(samples)
        want = sum(s.shares[key] / (sum(s.shares.values()) or 1.0) for s in samples) / len(samples)
        worst = max(worst, abs(got - want) * 100)
    return worst
