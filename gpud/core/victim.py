"""A running job as the eviction rules and the victim-order plugins see it."""

from __future__ import annotations

from gpud.core.queues import QueueState
from gpud.model import JobSpec


class Victim:
    """A running job as a candidate for eviction: the job, its queue (None for a project the policy
    no longer has) and its running tasks."""

    __slots__ = ("job", "queue", "tasks", "started")

    def __init__(self, job: JobSpec, queue: QueueState | None, tasks: list[int], now: float) -> None:
        self.job = job
        self.queue = queue
        self.tasks = tasks
        if not job.is_running:
            self.started = now
        else:
            self.started = job.started if job.started is not None else job.submitted

    @property
    def placed_this_cycle(self) -> bool:
        """True for a job the running cycle placed: it has not started, so nothing is lost by undoing it."""
        return not self.job.is_running

    def __repr__(self) -> str:
        return f"Victim({self.job.id}, tasks={self.tasks})"
