"""Queue order: the most deprived queue is served first (reference 002's two-level heap).

First difference wins: below fair share before over it; within quota
before over it; higher over-quota priority; smaller dominant share with
the job; declared earlier in the policy.
"""

from gpud import hookimpl
from gpud.core.orders import NATIVE, queue_order_key


@hookimpl
def gpud_queue_order_key(queue, job, need):
    return queue_order_key(queue, job, need)


setattr(gpud_queue_order_key, NATIVE, queue_order_key)  # the core may call it directly (gpud.core.hooks.first_result)
