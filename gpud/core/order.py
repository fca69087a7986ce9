"""The two-level heap: departments, then projects inside them, then each project's jobs in order."""

from __future__ import annotations

import heapq
import itertools
from collections import defaultdict
from typing import Callable, Iterable

from gpud.core.hooks import first_result
from gpud.core.queues import QueueState
from gpud.core.state import ClusterState
from gpud.model import JobSpec

Skip = Callable[[JobSpec], bool]


def jobs_by_queue(state: ClusterState, jobs: Iterable[JobSpec]) -> dict[QueueState, list[JobSpec]]:
    """Group jobs by project queue, each list sorted by the job-order plugin."""
    job_key = first_result(state.hook.gpud_job_order_key, state.pm)
    grouped: dict[QueueState, list[JobSpec]] = defaultdict(list)
    for job in jobs:
        queue = state.queue_of(job)
        if queue is not None:
            grouped[queue].append(job)
    for queue_jobs in grouped.values():
        queue_jobs.sort(key=lambda job: job_key(job=job))
    return grouped


def serve_in_order(state: ClusterState, grouped: dict[QueueState, list[JobSpec]],
                   visit: Callable[[JobSpec], Skip | None]) -> None:
    """Visit every job once, always taking the next job of the most deprived queue.

    Queues compare by the queue-order plugin with their next job, first
    among departments, then among the department's projects; a queue's key
    is recomputed after each of its jobs. ``visit`` may return a predicate:
    the queue's following jobs are then passed over while it holds (it
    records why they wait), which keeps a cycle from trying, one by one,
    thousands of jobs that cannot be easier than one that just failed.
    """
    queue_key = first_result(state.hook.gpud_queue_order_key, state.pm)
    cursor: dict[QueueState, int] = {queue: 0 for queue in grouped}
    tiebreak = itertools.count()

    def key(queue: QueueState, head: QueueState) -> tuple:
        job = grouped[head][cursor[head]]
        need = state.need(job, len(state.pending_tasks(job.id)))
        return (queue_key(queue=queue, job=job, need=need), next(tiebreak))

    project_heaps: dict[QueueState, list] = defaultdict(list)
    for project in grouped:
        if grouped[project]:
            heapq.heappush(project_heaps[project.parent], (key(project, project), project))
    dept_heap = [(key(dept, heap[0][1]), dept) for dept, heap in project_heaps.items()]
    heapq.heapify(dept_heap)
    while dept_heap:
        _, dept = heapq.heappop(dept_heap)
        heap = project_heaps[dept]
        _, project = heapq.heappop(heap)
        queue_jobs = grouped[project]
        i = cursor[project]
        skip = visit(queue_jobs[i])
        i += 1
        if skip is not None:
            while i < len(queue_jobs) and skip(queue_jobs[i]):
                i += 1
        cursor[project] = i
        if i < len(queue_jobs):
            heapq.heappush(heap, (key(project, project), project))
        if heap:
            heapq.heappush(dept_heap, (key(dept, heap[0][1]), dept))
