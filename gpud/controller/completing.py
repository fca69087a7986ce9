"""Jobs still completing (Slurm's COMPLETING): an earlier incarnation of one of their tasks is being stopped.

A preempted, requeued, moved or resized job may run again only once every
incarnation it had before has ended on its node (the node reports the
exit), or once that node is known dead past its own lease enforcement: two
copies of one job must never run at once, as both would write the job's
checkpoint directory. This table says which jobs wait so, for what, and
since when; the cluster keeps it in step with its nodes' ``stopping`` lists.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Stopping:
    """One incarnation of a job's task that its node is stopping: where, which, and when the stop was sent."""

    node: str
    task: int
    attempt: int
    since: float


def job_of(key: str) -> tuple[str, int, int] | None:
    """The job id, task and attempt of an incarnation key ("job/task/attempt"); None when malformed."""
    job, _, rest = key.rpartition("/")
    job, _, task = job.rpartition("/")
    try:
        return (job, int(task), int(rest)) if job else None
    except ValueError:
        return None


class Completing:
    """Per job, the incarnations of its tasks still being stopped on some node."""

    def __init__(self) -> None:
        self._jobs: dict[str, dict[str, Stopping]] = {}

    def add(self, node: str, key: str, since: float) -> None:
        """The node is stopping incarnation ``key`` ("job/task/attempt") since ``since``."""
        parsed = job_of(key)
        if parsed is None:
            return
        job, task, attempt = parsed
        known = self._jobs.setdefault(job, {})
        if key not in known or known[key].node != node:
            known[key] = Stopping(node, task, attempt, since)

    def ended(self, node: str, key: str) -> str | None:
        """Incarnation ``key`` on ``node`` is gone; returns its job's id when that job has nothing left stopping."""
        parsed = job_of(key)
        if parsed is None:
            return None
        job = parsed[0]
        known = self._jobs.get(job)
        if known is None or key not in known or known[key].node != node:
            return None
        del known[key]
        if known:
            return None
        del self._jobs[job]
        return job

    def on_node(self, node: str) -> list[tuple[str, str]]:
        """(job id, incarnation key) of every incarnation being stopped on ``node``."""
        return [(job, key) for job, known in self._jobs.items() for key, stop in known.items() if stop.node == node]

    def of(self, job: str) -> list[Stopping]:
        """The incarnations of ``job`` still being stopped, by node, task and attempt ([] when none)."""
        return sorted((self._jobs.get(job) or {}).values(), key=lambda s: (s.node, s.task, s.attempt))

    def forget(self, job: str) -> None:
        """The job has ended for good: whatever of it is still stopping holds nothing back."""
        self._jobs.pop(job, None)

    def __contains__(self, job: object) -> bool:
        return job in self._jobs

    def __len__(self) -> int:
        return len(self._jobs)


def completing_text(stopping: list[Stopping], now: float, grace_s: float) -> str:
    """Why a job waits for its previous run, for people: which tasks on which nodes, and for how long at most."""
    by_node: dict[str, list[int]] = {}
    for stop in stopping:
        by_node.setdefault(stop.node, []).append(stop.task)
    where = ", ".join(f"task{'s' if len(tasks) > 1 else ''} {','.join(map(str, sorted(set(tasks))))} on node {node}"
                      for node, tasks in by_node.items())
    left = max(0.0, min(stop.since for stop in stopping) + grace_s - now)
    return (f"waits for its previous run to end: {where} still being stopped "
            f"(SIGKILL in {left:.0f} s at the latest, after the {grace_s:g} s grace period)")
