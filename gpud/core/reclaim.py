"""The reclaim action: a queue below its fair share takes resources back from queues above theirs."""

from __future__ import annotations

import itertools
from typing import Final, TYPE_CHECKING

from gpud.core.admission import refusal
from gpud.core.allocate import gang_tasks, needed_tasks, started
from gpud.core.backlog import Group
from gpud.core.shapes import FailedShapes
from gpud.core.evict import VictimLists, judged, make_room
from gpud.core.order import Entry, Skip, serve_in_order
from gpud.core.queues import QueueState
from gpud.core.state import ClusterState, Victim
from gpud.model import EPS, RESOURCES, Evicted, JobSpec, OverLevel, Resources

if TYPE_CHECKING:
    from gpud.core.session import Session

RULE: Final = "reclaim"


def _taken(need: Resources, victim: JobSpec) -> Resources:
    """The part of ``need`` a victim gives back: only the resources its tasks hold.

    A queue is a victim only when it is over its fair share (or quota) in
    one of these. Were it enough to be over in a resource the victim does
    not hold, two queues could each be over in a resource the other's job
    does not use and take the same node back and forth every cycle.
    """
    request = victim.request
    return Resources(need.gpu if request.uses_gpu else 0.0, need.cpu if request.cpus > EPS else 0.0,
                     need.memory if request.memory_gib > EPS else 0.0)


def _over_in(queue: QueueState, level: Resources, taken: Resources) -> str:
    """The first resource of ``taken`` in which ``queue`` holds more than ``level`` (GPUs if none)."""
    held = queue.allocated
    return next((r for r in RESOURCES if taken.get(r) > EPS and held.get(r) > level.get(r) + EPS), "gpu")


def _level(mine: QueueState, theirs: QueueState, taken: Resources, need: Resources) -> bool | None:
    """Whether ``theirs`` is over its fair share (True) or only over its quota (False), in a resource of
    ``taken``, for ``mine`` to take ``need`` from it; None when it may not."""
    if not mine.fits_fair_share(need):
        return None
    if not theirs.implicit and not theirs.over(theirs.quota_bound, taken):
        return None
    if theirs.over(theirs.fair_share, taken):
        return True
    if not theirs.implicit and mine.fits_quota(need):
        return False
    return None


def _levels(queue: QueueState, victim_queue: QueueState, taken: Resources, need: Resources,
            seen: dict[QueueState, bool | None] | None = None) -> list[tuple[QueueState, bool]] | None:
    """The victim side's queues compared, each with ``_level``; None when ``queue``, taking ``need``,
    may not take ``taken`` from ``victim_queue``. ``seen`` keeps the departments' answers while nothing
    changes."""
    found = []
    mine, theirs = queue.parent, victim_queue.parent
    if mine is not theirs and mine is not None and theirs is not None:  # departments differ
        if seen is not None and theirs in seen:
            over = seen[theirs]
        else:
            over = _level(mine, theirs, taken, need)
            if seen is not None:
                seen[theirs] = over
        if over is None:
            return None
        found.append((theirs, over))
    over = _level(queue, victim_queue, taken, need)
    if over is None:
        return None
    found.append((victim_queue, over))
    return found


class _Hopeless(Skip):
    """Passes over a group whose next job is at least as large as one of its queue that found no victims."""

    def __init__(self, state: ClusterState, failed: dict[QueueState, FailedShapes]) -> None:
        self.state = state
        self.failed = failed

    def holds(self, job: JobSpec, queue: QueueState, group: Group | None = None) -> bool:
        shapes = self.failed.get(queue)
        state = self.state
        return shapes is not None and shapes.find(job, gang_tasks(state, job), 0,
                                                  state.shapes.of_group(group) if group is not None else -1) is not None


def reclaim(session: Session) -> None:
    """For each pending job whose queue stays within its fair share, evict from queues above theirs.

    Victims come first from queues over their fair share, then from queues
    over their quota (only while the reclaimer stays within its own quota),
    in a resource both the pending job needs and the victim holds; the test
    is made before each victim, so a queue at or below its quota is never a
    victim. Departments are compared first, then projects.
    """
    state, placer = session.state, session.placer
    lists = VictimLists(state)
    failed: dict[QueueState, FailedShapes] = {}
    by_pool: dict[str, list[QueueState]] = {}
    for queue in state.queues.values():
        if queue.kind == "project":
            by_pool.setdefault(queue.pool, []).append(queue)

    over_known: dict[tuple, tuple[int, list[QueueState], list[QueueState]]] = {}
    victim_queues: dict[tuple, tuple[int, list[QueueState], list[QueueState]]] = {}

    def over_lists(queue: QueueState, held: Resources) -> tuple[list[QueueState], list[QueueState]]:
        """The other queues of the pool over their fair share (theirs or their department's, against
        another department) and those over only their quota, in a resource ``held`` uses."""
        # The answer depends on which resources ``held`` uses, not how much: kept while nothing changes.
        key = (queue.pool, queue.parent, held.gpu > EPS, held.cpu > EPS, held.memory > EPS)
        known = over_known.get(key)
        if known is None or known[0] != state.changes:
            share: list[QueueState] = []
            quota: list[QueueState] = []
            for q in by_pool[queue.pool]:
                if q.over(q.fair_share, held) or (q.parent is not queue.parent and q.parent is not None
                                                  and q.parent.over(q.parent.fair_share, held)):
                    share.append(q)
                elif q.over(q.quota_bound, held):
                    quota.append(q)
            known = over_known[key] = (state.changes, share, quota)
        return [q for q in known[1] if q is not queue], [q for q in known[2] if q is not queue]

    hopeless = _Hopeless(state, failed)

    def visit(job: JobSpec) -> Skip | None:
        # An elastic job running at least its minimum grows one task at a time, each reclaimed as a
        # job of one task would be, while its queue stays within its fair share.
        while True:
            waiting = state.pending_count(job.id)
            skip = attempt(job)
            left = state.pending_count(job.id)
            if skip is not None or not left or left == waiting or needed_tasks(state, job)[1] > 0:
                return skip

    def attempt(job: JobSpec) -> Skip | None:
        pending, minimum = needed_tasks(state, job)
        if not pending:
            return None
        queue = state.project_queue(job)
        if hopeless.holds(job, queue):
            return hopeless
        tasks = max(minimum, 1)
        need = state.need(job, tasks)
        waiting = len(pending)

        def need_now() -> Resources:
            # The job's tasks placed so far by make_room are the queue's already: only the rest is to come.
            left = tasks - (waiting - state.pending_count(job.id))
            return need if left >= tasks else state.need(job, left if left > 1 else 1)
        shapes = failed.get(queue) or failed.setdefault(queue, FailedShapes(state))
        if not queue.fits_fair_share(need):  # so would any job as large in a resource it goes over in
            for resource in queue.excess(queue.fair_share, need):
                shapes.add(job, tasks, None, binding=(resource,))
            return hopeless
        if refusal(queue, job, need):
            return None
        held = state.task_need(job)

        # Victims come first from queues over their fair share; those of queues over only their quota
        # are asked for only when that is not enough (``strict`` false).
        strict = True
        passed_over = False  # a victim refused only because its queue is over only its quota

        def eligible(victim: Victim) -> Evicted | None:
            return rule_for(victim.queue, _taken(held, victim.job)) if victim.queue is not None else None

        def rule_for(victim_queue: QueueState, taken: Resources) -> Evicted | None:
            nonlocal passed_over
            coming = need_now()
            found = _levels(queue, victim_queue, taken, coming)
            if found is None:
                return None
            if strict and not all(over_fair for _, over_fair in found):
                passed_over = True
                return None
            why = []
            resource = "gpu"
            for theirs, over_fair in found:
                bound = theirs.fair_share if over_fair else theirs.quota_bound
                resource = _over_in(theirs, bound, taken)
                level = theirs.fair_share if over_fair else theirs.quota
                why.append(OverLevel(theirs.kind, theirs.name, resource, theirs.allocated.get(resource),
                                     level.get(resource), over_fair))
            after = queue.allocated.get(resource) + coming.get(resource)
            return Evicted(RULE, job.id, queue.name, over=tuple(why), resource=resource, after=after,
                           fair_share=queue.fair_share.get(resource))

        # What a victim gives back is part of ``held``: a queue over its level in none of ``held``
        # has no victim for the job. Of the others, only victims holding a resource their queue is
        # over in are offered, so no node is chosen for victims that may not go.
        # Which queues may give back depends on which resources ``held`` uses and on whether this
        # queue and its department fit their fair share and quota with ``need``: kept while nothing changes.
        parent = queue.parent
        key = (queue, held.gpu > EPS, held.cpu > EPS, held.memory > EPS, queue.fits_quota(need),
               parent is None or parent.fits_fair_share(need), parent is None or parent.fits_quota(need))
        known = victim_queues.get(key)
        if known is None or known[0] != state.changes:
            over_share, over_quota = over_lists(queue, held)
            seen: dict[QueueState, bool | None] = {}
            known = victim_queues[key] = (state.changes,
                                          [q for q in over_share if _levels(queue, q, held, need, seen) is not None],
                                          [q for q in over_quota if _levels(queue, q, held, need, seen) is not None])
        if not known[1] and not known[2] and placer.find(job) is None:
            shapes.add(job, tasks, None)  # no queue may give back, and there is no room without: as make_room finds
            return hopeless
        judged_at: dict[tuple, tuple[int, bool]] = {}
        held_gpu, held_cpu, held_mem = held.gpu > EPS, held.cpu > EPS, held.memory > EPS

        def may_go(victim: Victim) -> bool:
            nonlocal passed_over
            # The answer for a queue and what its victim gives back holds until an allocation changes.
            if victim.queue is None:
                return False
            request = victim.job.request  # which resources _taken would give back, without making it
            key = (victim.queue, held_gpu and request.uses_gpu, held_cpu and request.cpus > EPS,
                   held_mem and request.memory_gib > EPS, strict)
            known = judged_at.get(key)
            if known is None or known[0] != state.changes:
                found = _levels(queue, victim.queue, _taken(held, victim.job), need_now())
                known = judged_at[key] = (state.changes, found is not None and (
                    not strict or all(over_fair for _, over_fair in found)))
                if found is not None and not known[1]:
                    passed_over = True
            return known[1]

        if known[1]:
            candidates = judged(lists.of_queues(known[1]), may_go)
            if make_room(state, placer, job, candidates, RULE, eligible, lists):
                started(session, job, queue)
                return None
        if known[2] or passed_over or not known[1]:
            strict = False
            judged_at.clear()
            queued = itertools.chain(lists.of_queues(known[1]), lists.of_queues(known[2]))
            if make_room(state, placer, job, judged(queued, may_go), RULE, eligible, lists):
                started(session, job, queue)
                return None
        shapes.add(job, tasks, None)
        return hopeless

    def fits(queue: QueueState, group: Group) -> bool:
        return queue.fits_fair_share(state.group_need(group))

    def admit(queue: QueueState, heads: list[Entry]) -> list[Entry]:
        # Asked before the first visit: groups whose one task would take the queue over its fair share wait.
        # Every group of a long backlog passes here: fits_fair_share, inline, with the same arithmetic.
        share = queue.fair_share
        gpu, cpu, mem = queue.alloc_gpu, queue.alloc_cpu, queue.alloc_mem
        gpu_level, cpu_level, mem_level = share.gpu + EPS, share.cpu + EPS, share.memory + EPS
        admitted = []
        for entry in heads:
            group: Group = entry[2]
            need = group.need
            if need is None:
                need = state.group_need(group)
            if not ((need.gpu > EPS and gpu + need.gpu > gpu_level) or (need.cpu > EPS and cpu + need.cpu > cpu_level)
                    or (need.memory > EPS and mem + need.memory > mem_level)):
                admitted.append(entry)
        return admitted

    unblocked_at: dict[QueueState, tuple[int, int]] = {}  # (versions) when ``blocked`` last said False

    def blocked(queue: QueueState) -> bool:
        # Every group of the queue is at least as large as one of its smallest (the cover): once each
        # of those failed or would take the queue over its fair share, every group left would too.
        shapes = failed.get(queue)
        if shapes is None:
            return False
        versions = (shapes.version, queue.changes)
        if unblocked_at.get(queue) == versions:
            return False
        cover = state.covers.of(queue)
        if not cover:
            unblocked_at[queue] = versions
            return False
        for group in cover:
            job = group.jobs[0]
            tasks = max(job.gang_minimum, 1)
            need = state.group_need(group)
            if queue.fits_fair_share(need if tasks == 1 else need.scaled(tasks)) and shapes.find(job, tasks) is None:
                unblocked_at[queue] = versions
                return False
        return True

    def some_job_fits(queue: QueueState) -> bool:
        # No job fits the fair share when none of the queue's smallest requests does.
        cover = state.covers.of(queue)
        return cover is None or any(fits(queue, group) for group in cover)

    below = [q for q in state.backlog.by_queue if (q.alloc_gpu < q.fair_share.gpu - EPS
             or q.alloc_cpu < q.fair_share.cpu - EPS or q.alloc_mem < q.fair_share.memory - EPS)
             and some_job_fits(q)]
    serve_in_order(state, state.backlog, visit, admit, queues=below, drop=blocked)


class Reclaim:
    """The reclaim action: take back, from queues over their fair share, what queues below theirs are owed."""

    def __init__(self, session: Session) -> None:
        self.session = session

    def run(self) -> None:
        """Run the action once over the session's state."""
        reclaim(self.session)
