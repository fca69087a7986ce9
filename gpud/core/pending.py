"""What of a job still waits to start: its pending tasks, and how many of them must start together.

Every action asks this of the jobs it serves; it reads the state only.
"""

from __future__ import annotations

from gpud.core.state import ClusterState
from gpud.model import JobSpec


def needed_tasks(state: ClusterState, job: JobSpec) -> tuple[list[int], int]:
    """The job's pending task indices and how many of them must start together."""
    pending = state.pending_tasks(job.id)
    running = job.tasks - len(pending)
    return pending, max(0, job.gang_minimum - running)


def gang_tasks(state: ClusterState, job: JobSpec) -> int:
    """How many pending tasks of the job must start together, at least one."""
    if job.id not in state.touched and not job.placements:  # every task waits, as when the cycle began
        minimum = job.gang_minimum
        return minimum if minimum > 1 else 1
    return max(job.gang_minimum - job.tasks + state.placements[job.id].count(None), 1)
