"""Queue rules a job must pass before it may hold resources: limits and quota."""

from __future__ import annotations

from typing import Final

from gpud.core.blockers import LIMIT, NO_OVER_QUOTA, QUOTA
from gpud.core.queues import QueueState
from gpud.model import Blocker, JobSpec, Resources


NON_PREEMPTIBLE_ONLY: Final = 1
EVERY_JOB: Final = 0


# Whom each rule of the queues binds.
_BINDS: Final = {LIMIT: EVERY_JOB, QUOTA: NON_PREEMPTIBLE_ONLY, NO_OVER_QUOTA: EVERY_JOB}


def refusal(queue: QueueState, job: JobSpec, need: Resources) -> tuple[Blocker, int] | None:
    """Why the job's queues may not take ``need`` more (a blocker, as data), or None when they may.

    Checked at the project and its department: hard limits for every job;
    quota for non-preemptible jobs (together they run only within quota,
    whatever preemptible jobs use over it) and for queues that may not go
    over quota at all. An implicit department never
    refuses anything. Then the policy's limits per user and project
    (gpud.core.limits). The second value says whom the rule binds:
    NON_PREEMPTIBLE_ONLY, EVERY_JOB, or USER_ONLY (the job's user).
    """
    found = _refusing(queue, job, need)
    if found is not None:
        level, rule = found
        if rule == LIMIT:
            held, bound = level.allocated, level.limit
        else:
            held, bound = (level.fixed if rule == QUOTA else level.allocated), level.quota_bound
        return Blocker(rule, level.pool, level.kind, level.name, need=need, held=held, bound=bound), _BINDS[rule]
    book = queue.book
    if book is not None:
        return book.refusal(job, need.gpu, queue.pool)
    return None


def refuses(queue: QueueState, job: JobSpec, need: Resources) -> int | None:
    """Whom the rule ``refusal`` would name binds (NON_PREEMPTIBLE_ONLY, EVERY_JOB or USER_ONLY), None when
    no rule refuses: ``refusal`` without its blocker, for a caller that keeps no reason."""
    found = _refusing(queue, job, need)
    if found is not None:
        return _BINDS[found[1]]
    book = queue.book
    refused = book.refusal(job, need.gpu, queue.pool) if book is not None else None
    return refused[1] if refused is not None else None


def _refusing(queue: QueueState, job: JobSpec, need: Resources) -> tuple[QueueState, str] | None:
    """The first level (the project, then its department) whose rule refuses ``need`` more, and the rule."""
    for level in (queue, queue.parent):
        if level is None or level.implicit:
            continue
        if not level.fits_limit(need):
            return level, LIMIT
        if not job.preemptible and not level.fits_quota_fixed(need):
            return level, QUOTA
        if not level.settings.over_quota and not level.fits_quota(need):
            return level, NO_OVER_QUOTA
    return None
