"""Reasons worked out when read: of the jobs of a queue an action passed over at once, and of a group
blocked by what a smaller job taught.

Allocation leaves one ``PassedOver`` per such queue in
``Session.late_reasons`` and one ``Learnt`` per such group in
``Session.learnt_reasons``; the cycle's pending reasons ask them, job by
job, only when someone reads them. They live here, apart from allocation,
so that the session can hold them without importing an action.
"""

from __future__ import annotations

from typing import Any

from gpud.core.placement import restate_learnt
from gpud.core.queues import QueueState
from gpud.core.state import ClusterState
from gpud.model import Blocker, JobSpec


class PassedOver:
    """The reasons of a queue's jobs that an action passed over all at once."""

    def of(self, job: JobSpec) -> tuple[QueueState, Any] | None:
        """(queue, reason) for a job of the queue that has not started; None when none is known.

        The reason is as the action that passed the queue over keeps it; a subclass names its type.
        """
        raise NotImplementedError


class Learnt:
    """A group's blocker, learnt from a smaller job, with what restating it for the group needs of the
    moment the group was passed over: how many of its tasks must start together, and the free GPUs
    and CPUs then. Its jobs share their shape, so one restatement serves them all."""

    __slots__ = ("queue", "blocker", "tasks", "free")

    def __init__(self, queue: QueueState, blocker: Blocker, tasks: int, free: tuple[float, float]) -> None:
        self.queue = queue
        self.blocker = blocker
        self.tasks = tasks
        self.free = free

    def of(self, state: ClusterState, job: JobSpec) -> tuple[QueueState, Blocker | None]:
        """(queue, blocker) for a job of the group, in its own terms (gpud.core.placement.restate_learnt)."""
        return self.queue, restate_learnt(state, job, self.tasks, self.blocker, self.free)
