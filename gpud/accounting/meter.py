"""What a running task costs over a stretch of time, as charges to its user, project and department."""

from __future__ import annotations

from typing import Callable, Iterable

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


class Owed:
    """What placed tasks owe for the part of [start, end] they held their placement, added up per user,
    project and department in each pool, a job at a time (``pool_of`` names a node's pool)."""

    __slots__ = ("start", "end", "pool_of", "totals")

    def __init__(self, start: float, end: float, pool_of: Callable[[str], str]) -> None:
        self.start = start
        self.end = end
        self.pool_of = pool_of
        self.totals: dict[tuple[str, str, str], list[float]] = {}

    def add(self, job: Job) -> None:
        """Add what every placed task of ``job`` owes."""
        start, end, totals = self.start, self.end, self.totals
        for run in job.runs:
            placement, since = run.placement, run.since
            if placement is None or since is None:
                continue
            seconds = end - (since if since > start else start)
            if seconds <= 0:
                continue
            key = (self.pool_of(placement.node), job.project, job.user)
            total = totals.get(key)
            if total is None:
                total = totals[key] = [0.0, 0.0, 0.0]
            total[0] += gpus_of(placement) * seconds
            total[1] += job.cpus * seconds
            total[2] += job.memory_gib * seconds

    def charges(self, department_of: Callable[[str], str]) -> list[tuple[UsageKey, Amount]]:
        """The charges added so far, three for each (pool, project, user): its department, project and user."""
        charges: list[tuple[UsageKey, Amount]] = []
        for (pool, project, user), total in self.totals.items():
            amount = (total[0], total[1], total[2])
            charges += [(("department", pool, department_of(project)), amount), (("project", pool, project), amount),
                        (("user", pool, f"{project}/{user}"), amount)]
        return charges


def owed(jobs: Iterable[Job], start: float, end: float, pool_of: Callable[[str], str],
         department_of: Callable[[str], str]) -> list[tuple[UsageKey, Amount]]:
    """The charges of every placed task of ``jobs`` for the part of [start, end] it held its placement,
    added up per user, project and department in each pool (``pool_of`` names a node's pool)."""
    total = Owed(start, end, pool_of)
    for job in jobs:
        total.add(job)
    return total.charges(department_of)
