"""Why the jobs of a queue wait when an action passed over the whole queue at once.

Allocation leaves one per such queue in ``Session.late_reasons``;
the cycle's pending reasons ask it, job by job, only when someone reads
them. The base class lives here, apart from allocation, so that the state
can hold it without importing an action.
"""

from __future__ import annotations

from typing import Any

from gpud.core.queues import QueueState
from gpud.model import JobSpec


class PassedOver:
    """The reasons of a queue's jobs that an action passed over all at once."""

    def of(self, job: JobSpec) -> tuple[QueueState, Any] | None:
        """(queue, reason) for a job of the queue that has not started; None when none is known.

        The reason is as the action that passed the queue over keeps it; a subclass names its type.
        """
        raise NotImplementedError
