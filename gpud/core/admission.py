"""Queue rules a job must pass before it may hold resources: limits and quota."""

from __future__ import annotations

from typing import Final

from gpud.core.blockers import LIMIT, NO_OVER_QUOTA, QUOTA
from gpud.core.queues import QueueState
from gpud.model import Blocker, JobSpec, Resources


NON_PREEMPTIBLE_ONLY: Final = 1
EVERY_JOB: Final = 0


def refusal(queue: QueueState, job: JobSpec, need: Resources) -> tuple[Blocker, int] | None:
    """Why the job's queues may not take ``need`` more (a blocker, as data), or None when they may.

    Checked at the project and its department: hard limits for every job;
    quota for non-preemptible jobs (together they run only within quota,
    whatever preemptible jobs use over it) and for queues that may not go
    over quota at all. An implicit department never
    refuses anything. The second value says whom the rule binds:
    NON_PREEMPTIBLE_ONLY or EVERY_JOB.
    """
    for level in (queue, queue.parent):
        if level is None or level.implicit:
            continue
        if not level.fits_limit(need):
            return Blocker(LIMIT, level.pool, level.kind, level.name, need=need, held=level.allocated,
                           bound=level.limit), EVERY_JOB
        if not job.preemptible and not level.fits_quota_fixed(need):
            return Blocker(QUOTA, level.pool, level.kind, level.name, need=need, held=level.fixed,
                           bound=level.quota_bound), NON_PREEMPTIBLE_ONLY
        if not level.settings.over_quota and not level.fits_quota(need):
            return Blocker(NO_OVER_QUOTA, level.pool, level.kind, level.name, need=need, held=level.allocated,
                           bound=level.quota_bound), EVERY_JOB
    return None
