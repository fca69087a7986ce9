"""Queue order: the most deprived queue is served first (reference 002's two-level heap).

First difference wins: below fair share before over it; within quota
before over it; higher over-quota priority; smaller dominant share with
the job; declared earlier in the policy.
"""

from gpud import hookimpl
from gpud.core.orders import FairQueueOrder


class QueueOrderPlugin(FairQueueOrder):
    """The built-in queue order (``FairQueueOrder``); the core calls its ``key`` itself."""

    @hookimpl
    def gpud_queue_order_key(self, queue, job, need):
        return self.key(queue, job, need)


PLUGIN = QueueOrderPlugin()
