"""The reclaim action: a queue below its fair share takes resources back from queues above theirs."""

from __future__ import annotations

import itertools

from gpud.core.admission import refusal
from gpud.core.allocate import gang_tasks, needed_tasks
from gpud.core.shapes import FailedShapes
from gpud.core.evict import VictimLists, make_room
from gpud.core.order import Skip, serve_in_order
from gpud.core.placement import Placer
from gpud.core.queues import QueueState, format_amount
from gpud.core.state import ClusterState, Victim
from gpud.model import EPS, JobSpec, Resources

RULE = "reclaim"


def _level_pair(reclaimer: QueueState, victim: QueueState) -> list[tuple[QueueState, QueueState]]:
    """The (reclaimer side, victim side) queues compared: departments if they differ, and projects."""
    pairs = []
    if reclaimer.parent is not victim.parent and reclaimer.parent and victim.parent:
        pairs.append((reclaimer.parent, victim.parent))
    pairs.append((reclaimer, victim))
    return pairs


def _gpu_text(queue: QueueState, level: Resources) -> str:
    return f"{format_amount(queue.alloc_gpu)}/{format_amount(level.gpu)}"


def reclaim(state: ClusterState, placer: Placer) -> None:
    """For each pending job whose queue stays within its fair share, evict from queues above theirs.

    Victims come first from queues over their fair share, then from queues
    over their quota (only while the reclaimer stays within its own quota);
    the test is made before each victim, so a queue at or below its quota is
    never a victim. Departments are compared first, then projects.
    """
    lists = VictimLists(state)
    failed: dict[QueueState, FailedShapes] = {}
    by_pool: dict[str, list[QueueState]] = {}
    for queue in state.queues.values():
        if queue.kind == "project":
            by_pool.setdefault(queue.pool, []).append(queue)

    def hopeless(job: JobSpec, queue: QueueState) -> bool:
        shapes = failed.get(queue)
        return shapes is not None and shapes.find(job, gang_tasks(state, job)) is not None

    def visit(job: JobSpec) -> Skip | None:
        pending, minimum = needed_tasks(state, job)
        if not pending or (minimum == 0 and len(pending) < job.tasks):
            return None
        queue = state.project_queue(job)
        if hopeless(job, queue):
            return hopeless
        tasks = max(minimum, 1)
        need = state.need(job, tasks)
        shapes = failed.setdefault(queue, FailedShapes(state))
        if not queue.fits_fair_share(need):
            shapes.add(job, tasks, "")
            return hopeless
        if refusal(queue, job, need):
            return None
        held = state.task_need(job)
        others = [q for q in by_pool[queue.pool] if q is not queue]
        over_share = [q for q in others if q.over(q.fair_share, held)
                      or (q.parent is not queue.parent and q.parent and q.parent.over(q.parent.fair_share, held))]
        over_fair_share = set(over_share)
        over_quota = [q for q in others if q not in over_fair_share and q.over(q.quota_bound, held)]

        def eligible(victim: Victim) -> str | None:
            return rule_for(victim.queue) if victim.queue is not None else None

        def level(mine: QueueState, theirs: QueueState) -> bool | None:
            """Whether ``theirs`` is over its fair share (True) or only over its quota (False) for
            ``mine`` to take from it; None when it may not."""
            if not mine.fits_fair_share(need):
                return None
            if not theirs.implicit and not theirs.over(theirs.quota_bound, held):
                return None
            if theirs.over(theirs.fair_share, held):
                return True
            if not theirs.implicit and mine.fits_quota(need):
                return False
            return None

        def levels(victim_queue: QueueState, seen: dict | None = None) -> list[tuple[QueueState, bool]] | None:
            """The victim side's queues compared, each with ``level``; None when the job may not take
            from ``victim_queue``. ``seen`` keeps the departments' answers while nothing changes."""
            found = []
            for mine, theirs in _level_pair(queue, victim_queue):
                if seen is None or mine is queue:
                    over = level(mine, theirs)
                else:
                    over = seen[theirs] if theirs in seen else seen.setdefault(theirs, level(mine, theirs))
                if over is None:
                    return None
                found.append((theirs, over))
            return found

        def rule_for(victim_queue: QueueState) -> str | None:
            found = levels(victim_queue)
            if found is None:
                return None
            why = [f"{theirs.kind} {theirs.name} {_gpu_text(theirs, theirs.fair_share)} GPUs over fair share"
                   if over_fair else f"{theirs.kind} {theirs.name} {_gpu_text(theirs, theirs.quota)} GPUs over quota"
                   for theirs, over_fair in found]
            after = Resources(queue.alloc_gpu + need.gpu)
            return (f"reclaim: {'; '.join(why)}; for job {job.id} of project {queue.name} "
                    f"{format_amount(after.gpu)}/{format_amount(queue.fair_share.gpu)}")

        seen: dict[QueueState, bool | None] = {}
        candidates = itertools.chain(lists.of_queues(q for q in over_share if levels(q, seen) is not None),
                                     lists.of_queues(q for q in over_quota if levels(q, seen) is not None))
        if make_room(state, placer, job, candidates, RULE, eligible, lists):
            state.reasons.pop(job.id, None)
            return None
        shapes.add(job, tasks, "")
        return hopeless

    def admit(job: JobSpec, queue: QueueState) -> bool:
        return queue.fits_fair_share(state.task_need(job))

    below = [q for q in state.backlog.by_queue if q.alloc_gpu < q.fair_share.gpu - EPS
             or q.alloc_cpu < q.fair_share.cpu - EPS or q.alloc_mem < q.fair_share.memory - EPS]
    serve_in_order(state, state.backlog, visit, admit, queues=below)
