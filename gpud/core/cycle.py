"""One scheduling cycle: allocate, consolidate, reclaim, preempt; then the plan as a diff."""

from __future__ import annotations

from typing import Callable, Iterator, Mapping

import pluggy

from gpud.core.allocate import allocate
from gpud.core.consolidate import consolidate
from gpud.core.preempt import preempt
from gpud.core.reclaim import reclaim
from gpud.core.order import jobs_by_queue
from gpud.core.placement import Placer
from gpud.core.queues import QueueState
from gpud.core.state import ClusterState
from gpud.model import Bind, Eviction, JobSpec, Plan, QueueReport, Snapshot
from gpud.policy import Policy


def schedule(snapshot: Snapshot, policy: Policy, pm: pluggy.PluginManager) -> Plan:
    """Decide, from one snapshot, which tasks start where and which are stopped or moved.

    Pure: reads the snapshot and the policy, asks the plugins, and returns a
    plan; nothing outside is changed.
    """
    state = ClusterState(snapshot, policy, pm)
    placer = Placer(state)
    grouped = jobs_by_queue(state, state.pending_jobs)
    allocate(state, placer, grouped)
    consolidate(state, placer, _still_pending(state, grouped, lambda job: job.id in state.fragmented))
    reclaim(state, placer, _still_pending(state, grouped, _may_reclaim(state)))
    preempt(state, placer, _still_pending(state, grouped, _may_preempt(state)))
    return build_plan(state, snapshot)


def _still_pending(state: ClusterState, grouped: dict[QueueState, list[JobSpec]],
                   keep: Callable[[JobSpec], bool]) -> dict[QueueState, list[JobSpec]]:
    """The jobs of ``grouped`` that still wait and pass ``keep``, in the same order."""
    placements = state.placements
    result = {}
    for queue, jobs in grouped.items():
        kept = [job for job in jobs if None in placements[job.id] and keep(job)]
        if kept:
            result[queue] = kept
    return result


def _may_reclaim(state: ClusterState) -> Callable[[JobSpec], bool]:
    """A cheap first test for reclaim: the job's queue stays within its fair share with one task."""
    def keep(job: JobSpec) -> bool:
        queue = state.queue_of(job)
        return queue.fits_fair_share(state.task_need(job))
    return keep


def _may_preempt(state: ClusterState) -> Callable[[JobSpec], bool]:
    """A cheap first test for preemption: the job outranks some preemptible job running in its queue."""
    lowest: dict[QueueState, int] = {}
    for queue, running in state.running.items():
        priorities = [state.jobs[job_id].priority for job_id in running if state.jobs[job_id].preemptible]
        if priorities:
            lowest[queue] = min(priorities)

    def keep(job: JobSpec) -> bool:
        floor = lowest.get(state.queue_of(job))
        return floor is not None and job.priority > floor
    return keep


def build_plan(state: ClusterState, snapshot: Snapshot) -> Plan:
    """The difference between the snapshot and the state after the actions, as binds and evictions.

    A task put back on the very GPUs it had has not moved and appears in
    neither list.
    """
    binds: list[Bind] = []
    evictions: list[Eviction] = []
    for job_id in sorted(state.touched):
        job = state.jobs[job_id]
        final = state.placements[job_id]
        stopped, moved = [], []
        for task in range(job.tasks):
            before, after = job.task_placement(task), final[task]
            if before == after:
                continue
            if after is not None:
                binds.append(Bind(job_id, task, after))
            if before is not None:
                (moved if after is not None else stopped).append(task)
        rule, reason, for_job = state.evicted_by.get(job_id, ("", "", None))
        if stopped:
            evictions.append(Eviction(job_id, tuple(stopped), rule, reason, for_job))
        if moved:
            evictions.append(Eviction(job_id, tuple(moved), rule, reason, for_job, moved=True))
    waiting = [job.id for job in state.pending_jobs if None in state.placements[job.id]]
    waiting += [job_id for job_id, (queue, _) in state.reasons.items() if queue is None]
    return Plan(tuple(binds), tuple(evictions), PendingReasons(state, waiting),
                tuple(_report(q) for q in state.queues.values()))


def _report(queue: QueueState) -> QueueReport:
    return QueueReport(queue.name, queue.kind, queue.pool,
                       queue.parent.name if queue.parent else None, queue.quota,
                       queue.fair_share, queue.allocated, queue.demand)


class PendingReasons(Mapping[str, str]):
    """Why each pending job waits, formatted only when read (a cycle may leave 100,000 waiting)."""

    def __init__(self, state: ClusterState, job_ids: list[str]) -> None:
        self._reasons = state.reasons
        self._ids = dict.fromkeys(job_ids)
        self._prefix: dict[QueueState, str] = {}

    def __getitem__(self, job_id: str) -> str:
        if job_id not in self._ids:
            raise KeyError(job_id)
        queue, detail = self._reasons.get(job_id, (None, "not considered this cycle"))
        if queue is None:
            return detail
        prefix = self._prefix.get(queue)
        if prefix is None:
            prefix = self._prefix[queue] = queue.describe()
        return f"{prefix}; {detail}" if detail else prefix

    def __iter__(self) -> Iterator[str]:
        return iter(self._ids)

    def __len__(self) -> int:
        return len(self._ids)
