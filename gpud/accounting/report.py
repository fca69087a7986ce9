"""``gpuctl report``: GPU-hours, CPU-hours, jobs, waits and GPU efficiency of jobs, grouped.

A job counts in the window it ended in; jobs still running count in a
window that reaches now, with their use so far. GPU efficiency is the mean
of the utilisation samples of the group's jobs' GPUs (each sample weighs
the same) and the largest GPU memory any of its jobs held.
"""

from __future__ import annotations

import math
from typing import Callable, Iterable

from gpud.jobs import Job, gpus_of

GROUPINGS = ("user", "project", "department", "node")
HOUR = 3600.0


def job_gpu_seconds(job: Job, now: float) -> float:
    """GPU-seconds the job held: ended runs, plus its placed runs up to ``now``."""
    return job.gpu_seconds + sum(max(0.0, now - run.since) * gpus_of(run.placement) for run in job.runs
                                 if run.placement is not None and run.since is not None)


def job_cpu_seconds(job: Job, now: float) -> float:
    """CPU-seconds allocated to the job: its CPUs per task times its tasks times the time it ran."""
    return job.cpus * job.tasks * job.elapsed(now)


def report_rows(jobs: Iterable[Job], by: str, now: float, department_of: Callable[[str], str]) -> list[dict]:
    """One row per group (sorted by GPU-hours, most first); a job run on several nodes counts once in each,
    with an equal part of its hours. ``lost_gpu_hours`` is the work its preempted jobs lost: GPU-hours since
    their last checkpoint at each preemption."""
    if by not in GROUPINGS:
        raise ValueError(f"unknown grouping {by!r}: expected one of {', '.join(GROUPINGS)}")
    groups: dict[str, dict] = {}
    for job in jobs:
        gpu_s, cpu_s = job_gpu_seconds(job, now), job_cpu_seconds(job, now)
        if by == "node":
            hosts = list(dict.fromkeys(h for h in job.hosts if h)) or ["(none)"]
            names = [(h, 1.0 / len(hosts)) for h in hosts]
        else:
            name = {"user": job.user, "project": job.project, "department": department_of(job.project)}[by]
            names = [(name, 1.0)]
        for name, part in names:
            group = groups.setdefault(name, {"gpu_s": 0.0, "cpu_s": 0.0, "jobs": 0, "waits": [], "util_sum": 0.0,
                                             "util_n": 0, "peak": None, "lost_s": 0.0})
            group["gpu_s"] += gpu_s * part
            group["lost_s"] += job.lost_gpu_seconds * part
            group["cpu_s"] += cpu_s * part
            group["jobs"] += 1
            if job.started is not None:
                group["waits"].append(max(0.0, job.started - job.submitted))
            group["util_sum"] += job.gpu_util_sum
            group["util_n"] += job.gpu_util_samples
            if job.gpu_memory_peak_gib is not None:
                group["peak"] = max(group["peak"] or 0.0, job.gpu_memory_peak_gib)
    rows = []
    for name, g in groups.items():
        waits = sorted(g["waits"])
        rows.append({by: name, "gpu_hours": g["gpu_s"] / HOUR, "lost_gpu_hours": g["lost_s"] / HOUR,
                     "cpu_hours": g["cpu_s"] / HOUR, "jobs": g["jobs"],
                     "mean_wait_s": sum(waits) / len(waits) if waits else None,
                     "p95_wait_s": percentile(waits, 0.95),
                     "gpu_utilization": g["util_sum"] / g["util_n"] if g["util_n"] else None,
                     "gpu_memory_peak_gib": g["peak"]})
    rows.sort(key=lambda r: (-r["gpu_hours"], str(r[by])))
    return rows


def percentile(ordered: list[float], q: float) -> float | None:
    """The ``q`` quantile of sorted values by the nearest-rank method; None for no values."""
    if not ordered:
        return None
    return ordered[max(0, math.ceil(q * len(ordered)) - 1)]
