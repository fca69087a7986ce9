"""Queue rules a job must pass before it may hold resources: limits and quota."""

from __future__ import annotations

from typing import Final

from gpud.core.queues import QueueState, format_amount
from gpud.model import JobSpec, Resources


NON_PREEMPTIBLE_ONLY: Final = 1
EVERY_JOB: Final = 0


def refusal(queue: QueueState, job: JobSpec, need: Resources) -> tuple[str, int] | None:
    """Why the job's queues may not take ``need`` more, or None when they may.

    Checked at the project and its department: hard limits for every job;
    quota for non-preemptible jobs (together they run only within quota,
    whatever preemptible jobs use over it) and for queues that may not go
    over quota at all. An implicit department never
    refuses anything. Then the policy's limits per user and project
    (gpud.core.limits). The second value says whom the rule binds:
    NON_PREEMPTIBLE_ONLY, EVERY_JOB, or USER_ONLY (the job's user).
    """
    for level in (queue, queue.parent):
        if level is None or level.implicit:
            continue
        if not level.fits_limit(need):
            return (f"{level.kind} {level.name} is at its limit of {_amounts(level.limit, need)} "
                    f"(holds {_held(level, level.limit, need)})"), EVERY_JOB
        if not job.preemptible and not level.fits_quota_fixed(need):
            return (f"{level.kind} {level.name} has no quota left for it (non-preemptible jobs hold "
                    f"{_held(level, level.quota_bound, need, level.fixed)}; they run only within quota)"), \
                NON_PREEMPTIBLE_ONLY
        if not level.settings.over_quota and not level.fits_quota(need):
            return (f"{level.kind} {level.name} may not go over quota "
                    f"({_held(level, level.quota_bound, need)})"), EVERY_JOB
    book = queue.book
    if book is not None:
        return book.refusal(job, need.gpu)
    return None


def _held(queue: QueueState, level: Resources, need: Resources, alloc: Resources | None = None) -> str:
    alloc = queue.allocated if alloc is None else alloc
    parts = []
    for name, unit in (("gpu", "GPUs"), ("cpu", "CPUs"), ("memory", "GiB")):
        if need.get(name) > 0 and level.get(name) != float("inf"):
            parts.append(f"{format_amount(alloc.get(name))}/{format_amount(level.get(name))} {unit}")
    return ", ".join(parts)


def _amounts(level: Resources, need: Resources) -> str:
    parts = []
    for name, unit in (("gpu", "GPUs"), ("cpu", "CPUs"), ("memory", "GiB")):
        if need.get(name) > 0 and level.get(name) != float("inf"):
            parts.append(f"{format_amount(level.get(name))} {unit}")
    return ", ".join(parts)
