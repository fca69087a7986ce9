"""Making room by eviction: try victims one by one on a statement, commit only if the job then fits."""

from __future__ import annotations

import heapq
from typing import Callable, Iterable, Iterator

from gpud.core.allocate import needed_tasks
from gpud.core.hooks import first_result, has_implementations
from gpud.core.placement import Placer
from gpud.core.queues import QueueState
from gpud.core.state import ClusterState, Statement, Victim
from gpud.model import EPS, JobSpec

Eligibility = Callable[[Victim], str | None]


class VictimLists:
    """Each queue's running jobs in victim order, sorted once per action and filtered as they change."""

    def __init__(self, state: ClusterState) -> None:
        self.state = state
        self._key = first_result(state.hook.gpud_victim_order_key)
        self._veto = state.hook.gpud_can_evict if has_implementations(state.hook.gpud_can_evict) else None
        self._lists: dict[QueueState, list[tuple]] = {}
        self._min_runtime = state.policy.min_runtime_s

    def ordered(self, queue: QueueState) -> list[tuple]:
        """(key, victim) pairs of one queue's preemptible running jobs, first victim first."""
        found = self._lists.get(queue)
        if found is None:
            victims = [v for v in self.state.victims(queue) if v.job.preemptible]
            found = sorted(((self._key(victim=v), i, v) for i, v in enumerate(victims)), key=lambda t: t[:2])
            self._lists[queue] = found
        return found

    def merged(self, queues: Iterable[QueueState]) -> Iterator[Victim]:
        """The victims of several queues in one victim order."""
        for _, _, victim in heapq.merge(*(self.ordered(q) for q in queues), key=lambda t: t[0]):
            yield victim

    def protected(self, victim: Victim, preemptor: JobSpec, rule: str) -> str | None:
        """Why a victim may not be evicted at all: too young, or vetoed by a plugin."""
        if self.state.now - victim.started < self._min_runtime - EPS:
            return "ran less than the minimum run time"
        if self._veto is not None:
            vetoes = [v for v in self._veto(victim=victim, preemptor=preemptor, rule=rule) if v]
            if vetoes:
                return vetoes[0]
        return None


def next_unit(state: ClusterState, victim: Victim) -> list[int]:
    """The tasks to evict next from a victim: one task above its gang minimum, else all that run."""
    running = state.running_tasks(victim.job.id)
    if len(running) > victim.job.gang_minimum:
        return running[-1:]
    return running


def make_room(state: ClusterState, placer: Placer, job: JobSpec, candidates: Iterable[Victim],
              rule: str, eligible: Eligibility, lists: VictimLists,
              ready: Callable[[], bool] = lambda: True) -> bool:
    """Evict candidates in order until ``job`` fits, then keep every victim that can stay.

    Before each eviction ``eligible`` is asked again (the state changes as
    victims go) and returns the reason text recorded with the eviction, or
    None to pass the victim over. ``ready`` says whether the job may be
    placed yet (e.g. a non-preemptible job back within quota). Once the job
    is placed, evicted tasks are put back on their very GPUs where those are
    still free (they did not move), else placed elsewhere (moved); the rest
    are stopped. If the job never fits, nothing changes.
    """
    stmt = Statement(state)
    pending, minimum = needed_tasks(state, job)
    evicted: list[tuple[JobSpec, int, object]] = []
    placed = 0
    for victim in candidates:
        if not state.running_tasks(victim.job.id):
            continue
        while not placed:
            if lists.protected(victim, job, rule) is not None:
                break
            reason = eligible(victim)
            if reason is None:
                break
            unit = next_unit(state, victim)
            if not unit:
                break
            for task in unit:
                evicted.append((victim.job, task, stmt.evict(victim.job, task, rule, reason, job.id)))
            if ready() and _worth_trying(state, job, evicted[-1][2]):
                placed = placer.place(stmt, job, pending, max(minimum, 1))
        if placed:
            break
    if not placed:
        stmt.rollback()
        return False
    _settle_victims(state, placer, stmt, evicted)
    return True


def _worth_trying(state: ClusterState, job: JobSpec, freed) -> bool:
    """Cheap test before a placement attempt: could the node just freed, or the pool, hold the job now?"""
    request = job.request
    if job.tasks - len(state.pending_tasks(job.id)) == 0 and job.gang_minimum > 1:
        index = state.indexes[state.pool_of(job)]
        return index.free_gpu + EPS >= state.need(job, job.gang_minimum).gpu
    node = state.nodes[freed.node]
    if not node.holds_host_resources(request):
        return False
    if not request.uses_gpu:
        return True
    if request.is_shared:
        return any(f >= request.gpu_share_on(node.gpu_memory_gib) - EPS for f in node.free_share)
    return node.free_whole >= request.whole_gpus


def _settle_victims(state: ClusterState, placer: Placer, stmt: Statement,
                    evicted: list[tuple[JobSpec, int, object]]) -> None:
    by_job: dict[str, tuple[JobSpec, list[tuple[int, object]]]] = {}
    for vjob, task, placement in evicted:
        by_job.setdefault(vjob.id, (vjob, []))[1].append((task, placement))
    for vjob, tasks in by_job.values():
        mark = stmt.checkpoint()
        lost = [task for task, placement in tasks if not placer.restore(stmt, vjob, task, placement)]
        if lost:
            running = len(state.running_tasks(vjob.id))
            placer.place(stmt, vjob, lost, max(0, vjob.gang_minimum - running))
        running = len(state.running_tasks(vjob.id))
        if 0 < running < vjob.gang_minimum:
            stmt.rollback(mark)
