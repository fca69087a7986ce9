"""What a running task costs over a stretch of time, as charges to its user, project and department."""

from __future__ import annotations

from typing import Callable

from gpud.accounting.decay import Amount, UsageKey
from gpud.jobs import Job, TaskRun, gpus_of


def run_charges(job: Job, run: TaskRun, start: float, end: float, pool: str,
                department: str) -> list[tuple[UsageKey, Amount]]:
    """The charges of one task of ``job`` for the part of [start, end] it held its placement.

    GPUs count as held (a fraction its fraction, a memory slice its share of
    the GPU), CPUs and memory as requested per task. Nothing when the task
    holds nothing or the stretch is empty.
    """
    placement = run.placement
    if placement is None or run.since is None:
        return []
    seconds = end - max(start, run.since)
    if seconds <= 0:
        return []
    amount = (gpus_of(placement) * seconds, job.cpus * seconds, job.memory_gib * seconds)
    return [(("department", pool, department), amount), (("project", pool, job.project), amount),
            (("user", pool, f"{job.project}/{job.user}"), amount)]


def job_charges(job: Job, start: float, end: float, pool_of: Callable[[str], str],
                department_of: Callable[[str], str]) -> list[tuple[UsageKey, Amount]]:
    """The charges of every placed task of ``job`` over [start, end]; ``pool_of`` names a node's pool."""
    department = department_of(job.project)
    charges: list[tuple[UsageKey, Amount]] = []
    for run in job.runs:
        if run.placement is not None:
            charges += run_charges(job, run, start, end, pool_of(run.placement.node), department)
    return charges
