"""The built-in orders of jobs, queues and victims, as the core runs them.

The plugins in gpud.policies (job_order, queue_order, victim_order) answer
their hooks with these functions, and name them as ``NATIVE``: when such a
plugin is the hook's only implementation, the core calls the function
itself, which the compiled core (GPUD_COMPILE) runs compiled.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from gpud.core.hooks import NATIVE
from gpud.core.queues import QueueState
from gpud.model import JobSpec, Resources

if TYPE_CHECKING:
    from gpud.core.victim import Victim

__all__ = ["NATIVE", "job_order_key", "queue_order_key", "victim_order_key"]


def job_order_key(job: JobSpec) -> tuple:
    """Higher priority first, then earlier submission (then the order of submission and the id)."""
    return (-job.priority, job.submitted, job.seq, job.id)


def queue_order_key(queue: QueueState, job: JobSpec, need: Resources) -> tuple:
    """The most deprived queue first: below its fair share before over it, within quota before over
    it, higher over-quota priority, smaller dominant share with the job, declared earlier."""
    return (not queue.fits_fair_share(need), not queue.fits_quota(need),
            -queue.over_quota_priority, queue.dominant_share(need), queue.declared)


def victim_order_key(victim: Victim) -> tuple:
    """Lowest priority first, then the most recently started (least work lost)."""
    return (victim.job.priority, -victim.started, -victim.job.seq, victim.job.id)
