"""Queue order: the most deprived queue is served first (reference 002's two-level heap).

First difference wins: below fair share before over it; within quota
before over it; higher over-quota priority; smaller dominant share with
the job; declared earlier in the policy.
"""

from gpud import hookimpl


@hookimpl
def gpud_queue_order_key(queue, job, need):
    return (not queue.fits_fair_share(need), not queue.fits_quota(need),
            -queue.over_quota_priority, queue.dominant_share(need), queue.declared)
