"""Queue rules a job must pass before it may hold resources: limits and quota."""

from __future__ import annotations

from gpud.core.queues import QueueState, format_amount
from gpud.model import JobSpec, Resources


def refusal(queue: QueueState, job: JobSpec, need: Resources) -> str | None:
    """Why the job's queues may not take ``need`` more, or None when they may.

    Checked at the project and its department: hard limits for every job;
    quota for non-preemptible jobs (they run only within quota) and for
    queues that may not go over quota at all. An implicit department never
    refuses anything.
    """
    for level in (queue, queue.parent):
        if level is None or level.implicit:
            continue
        if not level.fits_limit(need):
            return f"{level.kind} {level.name} would pass its limit of {_amounts(level.limit, need)}"
        if not job.preemptible and not level.fits_quota(need):
            return (f"{level.kind} {level.name} would pass its quota: {_after(level, need)} "
                    f"(non-preemptible jobs run only within quota)")
        if not level.settings.over_quota and not level.fits_quota(need):
            return f"{level.kind} {level.name} may not go over quota: {_after(level, need)}"
    return None


def _after(queue: QueueState, need: Resources) -> str:
    alloc = queue.allocated
    parts = []
    for name, unit in (("gpu", "GPUs"), ("cpu", "CPUs"), ("memory", "GiB")):
        if need.get(name) > 0:
            parts.append(f"{format_amount(alloc.get(name))}+{format_amount(need.get(name))}/"
                         f"{format_amount(queue.quota.get(name))} {unit}")
    return ", ".join(parts)


def _amounts(level: Resources, need: Resources) -> str:
    parts = []
    for name, unit in (("gpu", "GPUs"), ("cpu", "CPUs"), ("memory", "GiB")):
        if need.get(name) > 0:
            parts.append(f"{format_amount(level.get(name))} {unit}")
    return ", ".join(parts)
