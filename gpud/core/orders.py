"""The orders of jobs, queues and victims: the classes the core calls, and the built-in orders.

An order is an object whose ``key`` method answers its hook
(``gpud_job_order_key``, ``gpud_queue_order_key``, ``gpud_victim_order_key``).
The plugins of gpud.policies (job_order, queue_order, victim_order) are
objects of the built-in classes below, with hook methods that answer with
``key``: the core, which reads the plugins once (gpud.core.policy_set),
calls ``key`` itself, and with a compiled core (GPUD_COMPILE) the built-in
orders run compiled. A plugin of one's own may be such an object too; its
hook method must answer as its ``key`` does.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from mypy_extensions import mypyc_attr

from gpud.core.queues import QueueState
from gpud.model import JobSpec, Resources

if TYPE_CHECKING:
    from gpud.core.victim import Victim

__all__ = ["JobOrder", "PriorityJobOrder", "AgedJobOrder", "QueueOrder", "FairQueueOrder", "VictimOrder", "PriorityVictimOrder",
           "LeastLostWorkVictimOrder"]


@mypyc_attr(allow_interpreted_subclasses=True)
class JobOrder:
    """The order of the pending jobs inside a queue: smaller ``key`` first."""

    @property
    def priority_first(self) -> bool:
        """True when every key starts with minus the job's priority: the jobs of one priority are
        together, higher priorities first (the user order and preemption's admission rely on it)."""
        return False

    def key(self, job: JobSpec) -> Any:
        """The job's sort key, a pure function of the job (it is kept while the job waits)."""
        raise NotImplementedError


@mypyc_attr(allow_interpreted_subclasses=True)
class PriorityJobOrder(JobOrder):
    """The built-in job order: higher priority first, then earlier submission."""

    @property
    def priority_first(self) -> bool:
        """True: the key starts with minus the priority."""
        return True

    def key(self, job: JobSpec) -> Any:
        """Higher priority first, then earlier submission (then the order of submission and the id)."""
        return (-job.priority, job.submitted, job.seq, job.id)


@mypyc_attr(allow_interpreted_subclasses=True)
class AgedJobOrder(JobOrder):
    """The built-in job order with aging (the policy's ``age_weight``): a job's priority grows by
    ``weight`` points for each hour it waits, so the job with the higher ``priority + weight x hours
    waited`` comes first, then the earlier submitted.

    Every job ages alike, so two jobs compare at any moment as their
    ``priority - weight x submitted hours`` do: the key is fixed at
    submission, as the backlog keeps it, and the order still changes with
    the wait (a job passes a newer one of a higher priority once it has
    waited ``priority difference / weight`` hours longer).
    """

    def __init__(self, weight: float) -> None:
        self.weight = weight

    def key(self, job: JobSpec) -> Any:
        """Lower ``weight x submitted hours - priority`` first, then earlier submission (then the order
        of submission and the id)."""
        return (self.weight * job.submitted / 3600.0 - job.priority, job.submitted, job.seq, job.id)


@mypyc_attr(allow_interpreted_subclasses=True)
class QueueOrder:
    """The order of the queues at one level (departments, or one department's projects): smaller
    ``key`` first."""

    def key(self, queue: QueueState, job: JobSpec, need: Resources) -> Any:
        """The queue's sort key when its next job is ``job``, whose waiting tasks ask for ``need``."""
        raise NotImplementedError

    def entry(self, queue: QueueState, job: JobSpec, need: Resources, tiebreak: int) -> tuple:
        """The queue's entry in a heap of queues: its key, then ``tiebreak``, then the queue, which
        is last in every entry."""
        return (self.key(queue, job, need), tiebreak, queue)


@mypyc_attr(allow_interpreted_subclasses=True)
class FairQueueOrder(QueueOrder):
    """The built-in queue order: the most deprived queue first."""

    def key(self, queue: QueueState, job: JobSpec, need: Resources) -> Any:
        """The most deprived queue first: below its fair share before over it, within quota before over
        it, higher over-quota priority, smaller dominant share with the job, declared earlier."""
        return (not queue.fits_fair_share(need), not queue.fits_quota(need),
                -queue.over_quota_priority, queue.dominant_share(need), queue.declared)

    def entry(self, queue: QueueState, job: JobSpec, need: Resources, tiebreak: int) -> tuple:
        """As ``QueueOrder.entry``, as one flat tuple: the keys are all of one length, and a heap then
        compares the entries field by field rather than tuple within tuple."""
        key: tuple = self.key(queue, job, need)
        return key + (tiebreak, queue)


@mypyc_attr(allow_interpreted_subclasses=True)
class VictimOrder:
    """The order in which a queue's running jobs are evicted: smaller ``key`` first."""

    @property
    def weighs_lost_work(self) -> bool:
        """True when every key starts with the victim's priority, then the GPU-seconds it would lose
        (``Victim.lost_gpu_seconds``), both ascending: evictions then choose, among the sets of victims
        that make room, the one that loses the least work (``gpud.core.victim_rooms``). An order of
        one's own that keeps this from a built-in order it extends, with another key, must say False."""
        return False

    def key(self, victim: Victim) -> Any:
        """The victim's sort key; it must not change within a cycle."""
        raise NotImplementedError


@mypyc_attr(allow_interpreted_subclasses=True)
class PriorityVictimOrder(VictimOrder):
    """The youngest-first victim order (the policy's ``victim_order = "youngest_first"``): lowest priority
    first, then the most recently started."""

    def key(self, victim: Victim) -> Any:
        """Lowest priority first, then the most recently started."""
        return (victim.job.priority, -victim.started, -victim.job.seq, victim.job.id)


@mypyc_attr(allow_interpreted_subclasses=True)
class LeastLostWorkVictimOrder(PriorityVictimOrder):
    """The built-in victim order: lowest priority first, then the fewest GPU-seconds lost
    (``Victim.lost_gpu_seconds``: since the last checkpoint, or since the start), then the most
    recently started.

    The key depends on the cycle's ``now``: two jobs of different sizes may
    change places from one cycle to the next, never within one.
    """

    @property
    def weighs_lost_work(self) -> bool:
        """True: the key is the priority, then the work lost."""
        return True

    def key(self, victim: Victim) -> Any:
        """Lowest priority first, then the least work lost, then the most recently started."""
        return (victim.job.priority, victim.lost_gpu_seconds, -victim.started, -victim.job.seq, victim.job.id)
