"""A running job as the eviction rules and the victim-order plugins see it."""

from __future__ import annotations

from gpud.core.queues import QueueState
from gpud.model import JobSpec


class Victim:
    """A running job as a candidate for eviction: the job, its queue (None for a project the policy
    no longer has) and its running tasks."""

    __slots__ = ("job", "queue", "tasks", "started", "now", "_lost")

    def __init__(self, job: JobSpec, queue: QueueState | None, tasks: list[int], now: float) -> None:
        self.job = job
        self.queue = queue
        self.tasks = tasks
        self.now = now
        self._lost = -1.0  # worked out when first read
        if not job.is_running:
            self.started = now
        else:
            self.started = job.started if job.started is not None else job.submitted

    @property
    def lost_gpu_seconds(self) -> float:
        """The GPU-seconds the job would lose if stopped now: the GPUs its tasks hold times the time since
        its last checkpoint, or since it started when it has none (or checkpointed before this start).

        Stopping any of a gang's tasks restarts the whole gang, so the whole job's GPUs count. A job the
        running cycle placed loses nothing.
        """
        if self._lost >= 0.0:
            return self._lost
        if not self.job.is_running:
            self._lost = 0.0
            return 0.0
        gpus = 0.0
        for placement in self.job.placements:
            if placement is not None:
                gpus += placement.gpu_share * len(placement.gpu_index)
        since = self.started
        checkpointed = self.job.checkpointed
        if checkpointed is not None and checkpointed > since:
            since = checkpointed
        self._lost = gpus * max(0.0, self.now - since)
        return self._lost

    @property
    def placed_this_cycle(self) -> bool:
        """True for a job the running cycle placed: it has not started, so nothing is lost by undoing it."""
        return not self.job.is_running

    def __repr__(self) -> str:
        return f"Victim({self.job.id}, tasks={self.tasks})"
