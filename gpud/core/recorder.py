"""Why each job waits: the one record of a cycle that every action writes through and the plan reads.

The recorder owns two things no action decides for itself. Precedence:
which reason a job is told when several were recorded (a job of an unknown
project, then an eviction, then the job's own reason, then its group's, then
its queue's). Restatement: a blocker learnt from a smaller job is said in the
terms of the job it now blocks, as it would be told had it been the first of
its shape to find no room, whichever smaller job taught the core. A cycle
passes over thousands of groups and few of their reasons are read, so a
group's or a queue's reason is restated only when first read, with the free
room of the moment it was passed over; so is the reason of a job preemption
passes over for an earlier job's failure, which needs no free room. A
preemptor's own blocker may be left to be made when read, too (``Explained``).
"""

from __future__ import annotations

import dataclasses
from typing import Callable

from gpud.core.backlog import Group
from gpud.core.blockers import (EVICTED, FRAGMENTED_RULE, GANG, NODE_SIZE, NOT_CONSIDERED, PREEMPT_SHARE, SHORTAGE,
                                over_share, restated, running)
from gpud.core.placement import explain_unplaced, free_room, largest_fit, matching_nodes, shortage
from gpud.core.queues import QueueState
from gpud.core.shapes import Failure
from gpud.core.state import ClusterState, EvictedBy
from gpud.model import Blocker, JobSpec

# A job's reason: the queue whose figures explain it (None: none does) and the blocker.
Found = tuple[QueueState | None, Blocker | None]


class Learnt:
    """A blocker learnt from a smaller job, with what restating it for another job needs: the queue,
    how many of the job's tasks must start together, and the free GPUs and CPUs when it was learnt
    (None: not known)."""

    __slots__ = ("queue", "blocker", "tasks", "free")

    def __init__(self, queue: QueueState, blocker: Blocker | None, tasks: int,
                 free: tuple[float, float] | None) -> None:
        self.queue = queue
        self.blocker = blocker
        self.tasks = tasks
        self.free = free


class SaidWhenRead:
    """A job's reason kept unsaid until first read: most of those a cycle records are never read."""

    def say(self, state: ClusterState) -> Found:
        """The reason, said now from what was kept when it was recorded (``state`` for the nodes' sizes)."""
        raise NotImplementedError


class Spared(SaidWhenRead):
    """A blocker a job is told without a try of its own, learnt from an earlier job (the ``failure`` it met):
    said in the job's terms when read (``restate_learnt``, with the free GPUs and CPUs when it was recorded,
    ``free``, where they matter), as the job was when recorded."""

    __slots__ = ("queue", "job", "tasks", "failure", "free")

    def __init__(self, queue: QueueState, job: JobSpec, tasks: int, failure: Failure,
                 free: tuple[float, float] | None = None) -> None:
        self.queue = queue
        self.job = job
        self.tasks = tasks
        self.failure = failure
        self.free = free

    def say(self, state: ClusterState) -> Found:
        """The failure's blocker in the job's own terms."""
        return self.queue, restate_learnt(state, self.job, self.tasks, self.failure.blocker, self.free)


class Explained(SaidWhenRead):
    """A job's own blocker, made when first read by ``explain`` (``ShareLimit.explain``)."""

    __slots__ = ("queue", "explain")

    def __init__(self, queue: QueueState, explain: Callable[[], Blocker]) -> None:
        self.queue = queue
        self.explain = explain

    def say(self, state: ClusterState) -> Found:
        """The blocker ``explain`` makes."""
        return self.queue, self.explain()


class PassedOver:
    """The reasons of a queue's jobs that an action passed over all at once, found when read."""

    def of(self, job: JobSpec) -> Learnt | None:
        """The blocker that covers a job of the queue that has not started, as the action that passed
        the queue over learnt it; None when none is known."""
        raise NotImplementedError


class ReasonRecorder:
    """Why each job the cycle's actions took, or passed over, still waits; made with the session.

    Actions record through its methods; the plan's pending reasons read
    ``of``. Evictions are recorded by the session's statements into
    ``evicted``, which is the recorder's too.
    """

    def __init__(self, state: ClusterState) -> None:
        self.state = state
        # Each job the cycle evicted: the eviction rule, its reason, the job it made room for.
        self.evicted: EvictedBy = {}
        # Jobs allocation found no room for though the free capacity was there: consolidation's work.
        self.fragmented: set[str] = set()
        # Jobs of unknown projects, as the cycle began: the plan lists them, and no action takes them.
        # dict.copy(), not dict(): a dict that jobs left has holes, and only copy() clones it whole.
        self.orphans: dict[str, Blocker] = state.orphans.copy()
        # A job's own reason, or one learnt from an earlier job, restated when first read (``Spared``), or
        # one made when first read (``Explained``).
        self._jobs: dict[str, Found | SaidWhenRead] = {}
        # A group passed over whole: its jobs share their shape, hence one reason, or one to restate.
        self._groups: dict[Group, Found | Learnt] = {}
        self._queues: dict[QueueState, PassedOver] = {}
        self._restated: dict[Group, Found | None] = {}  # groups' reasons restated when first read
        # A failure's blocker restated for a request (shape number, tasks that start together, GPUs asked).
        self._said: dict[tuple[Failure, int, int, float], Blocker | None] = {}

    # -- recording, by the actions --

    def waits(self, job_id: str, queue: QueueState | None, blocker: Blocker | None) -> None:
        """Record why a job the action took waits: it replaces whatever was recorded of the job."""
        self._jobs[job_id] = (queue, blocker)

    def overrule(self, job_id: str, queue: QueueState, blocker: Blocker | None) -> None:
        """Record a later action's blocker for a job: it replaces what was recorded, unless it is None
        (the action knows nothing better than the earlier one)."""
        if blocker is not None:
            self._jobs[job_id] = (queue, blocker)

    def overrule_when_read(self, job_id: str, queue: QueueState, explain: Callable[[], Blocker]) -> None:
        """``overrule`` with a blocker that ``explain`` makes when the job's reason is first read."""
        self._jobs[job_id] = Explained(queue, explain)

    def spared(self, job: JobSpec, queue: QueueState, tasks: int, failure: Failure) -> None:
        """Record, as ``overrule`` would, a later action's blocker for a job it passed over without a try
        (``tasks`` of its tasks must start together), learnt from an earlier job's ``failure``: said in the
        job's terms when read, as ``restate_learnt`` says it without the free room. A passed-over queue
        sees thousands of such jobs in a cycle, and few of their reasons are read."""
        if failure.has_blocker:
            self._jobs[job.id] = Spared(queue, job, tasks, failure)

    def learnt(self, job: JobSpec, queue: QueueState, tasks: int, failure: Failure) -> None:
        """Record that a job (``tasks`` of its tasks must start together) waits for the blocker of a
        failure learnt from an earlier, smaller job, in its own terms: a gang's count of nodes that could
        hold one task is made now; any other blocker is restated when read, with the free room of now
        (``in_own_terms``, which it equals)."""
        blocker = failure.blocker
        if blocker is not None and blocker.rule == GANG:
            self._jobs[job.id] = (queue, in_own_terms(self.state, job, tasks, blocker))
        else:
            free = free_room(self.state, job) if blocker is not None and blocker.rule == FRAGMENTED_RULE else None
            self._jobs[job.id] = Spared(queue, job, tasks, failure, free)

    def group_learnt(self, group: Group, job: JobSpec, queue: QueueState, tasks: int,
                     blocker: Blocker | None) -> None:
        """Record that every job of ``group`` (``job`` first) waits for a blocker learnt from an
        earlier job. Scattered room is restated when read, with the free room of now; any other
        blocker now."""
        if blocker is not None and blocker.rule == FRAGMENTED_RULE:
            self._groups[group] = Learnt(queue, blocker, tasks, free_room(self.state, job))
        else:
            self._groups[group] = (queue, in_own_terms(self.state, job, tasks, blocker))

    def group_learnt_from(self, group: Group, job: JobSpec, queue: QueueState, tasks: int, failure: Failure,
                          sid: int) -> None:
        """``group_learnt`` with the failure met (``sid``: the number of the group's shape): a blocker that
        does not depend on the moment is restated once for every group of the request (``restated``)."""
        blocker = failure.blocker
        if blocker is not None and blocker.rule in (FRAGMENTED_RULE, GANG):
            self.group_learnt(group, job, queue, tasks, blocker)
        else:
            self._groups[group] = (queue, self.restated(failure, sid, job, tasks))

    def restated(self, failure: Failure, sid: int, job: JobSpec, tasks: int) -> Blocker | None:
        """The failure's blocker in the terms of ``job`` (``tasks`` of its tasks start together; ``sid``:
        its shape's number, -1 when not known), as ``restate_learnt`` says it without the free room.

        Worked out once per failure and request: ``restate_learnt`` reads only
        the request, its pool and node selector (all named by the shape's number
        and the GPUs asked) and the nodes' sizes, and a cycle passes over the
        groups of one request, one per user of each project, by the thousand.
        """
        if sid < 0:
            sid = self.state.shapes.of(job)
        key = (failure, sid, tasks, job.request.gpus)
        said = self._said
        if key in said:
            return said[key]
        blocker = said[key] = restate_learnt(self.state, job, tasks, failure.blocker, None)
        return blocker

    def queue_passed_over(self, queue: QueueState, passed_over: PassedOver) -> None:
        """Record that every job the queue has left waits as ``passed_over`` says when read."""
        self._queues[queue] = passed_over

    def found_fragmented(self, job_id: str) -> None:
        """Note a job that found no room though its pool had the free capacity (for consolidation)."""
        self.fragmented.add(job_id)

    def started(self, job: JobSpec, queue: QueueState) -> None:
        """Record that the job got tasks placed: it waits no more, or (an elastic job started with
        fewer tasks than it asks for) why its other tasks still wait."""
        state = self.state
        left = state.pending_count(job.id)
        if not left:
            self._jobs.pop(job.id, None)
            return
        detail, _ = explain_unplaced(state, job, 1)
        self._jobs[job.id] = (queue, running(detail, job.tasks - left, job.tasks))

    # -- reading, by the plan --

    def of(self, job_id: str, group: Group | None) -> Found:
        """Why a job still waits after the cycle (``group``: its backlog group, if any), by precedence:
        a job of an unknown project is told so; an evicted job, why it was evicted; then the job's own
        reason, its group's, its queue's; a job no action took is told it was not considered."""
        orphan = self.orphans.get(job_id)
        if orphan is not None:
            return None, orphan
        evicted = self.evicted.get(job_id)
        if evicted is not None:
            return None, Blocker(EVICTED, evicted=evicted[1])
        kept = self._jobs.get(job_id)
        found: Found | None
        if isinstance(kept, SaidWhenRead):
            found = self._jobs[job_id] = kept.say(self.state)  # kept in its place once said
        else:
            found = kept
        if found is None and group is not None:
            found = self._of_group(job_id, group)
        return found if found is not None else (None, Blocker(NOT_CONSIDERED))

    def _of_group(self, job_id: str, group: Group) -> Found | None:
        """The reason recorded for the job's group or queue, restated for the group when first read."""
        kept = self._groups.get(group)
        if kept is not None and not isinstance(kept, Learnt):
            return kept
        if kept is None and group.queue not in self._queues:
            return None
        if group in self._restated:
            return self._restated[group]
        job = self.state.jobs.get(job_id)
        if job is None:  # it left since the cycle: the group's reason is worked out from a job still known
            return None
        found: Found | None = None
        learnt = kept if kept is not None else self._queues[group.queue].of(job)
        if learnt is not None:
            found = learnt.queue, restate_learnt(self.state, job, learnt.tasks, learnt.blocker, learnt.free)
        self._restated[group] = found
        return found


def in_own_terms(state: ClusterState, job: JobSpec, tasks: int, blocker: Blocker | None) -> Blocker | None:
    """``blocker``, learnt from a smaller job, as the job would be told had it been the first of its
    shape to find no room, now: a gang's count of nodes that could hold one task is made anew for it."""
    if blocker is None or blocker.rule not in (FRAGMENTED_RULE, GANG):
        return restate_learnt(state, job, tasks, blocker, None)
    if blocker.rule == GANG:
        return explain_unplaced(state, job, tasks)[0]
    return restate_learnt(state, job, tasks, blocker, free_room(state, job))


def restate_learnt(state: ClusterState, job: JobSpec, tasks: int, blocker: Blocker | None,
                   free: tuple[float, float] | None) -> Blocker | None:
    """``blocker``, learnt from a smaller job, in the terms of ``job`` (``tasks`` of its tasks start
    together), as ``explain_unplaced`` would have said it when ``free`` (GPUs, CPUs) was free: a
    shortage with the job's own need, a task larger than any node with its own request; where free room was too scattered for the smaller request, this
    one may be larger than any node, or lack GPUs or CPUs outright, or else find the room scattered
    for its own request. Reads only the nodes' sizes, never what is free now: a reason may be read
    while the next cycle runs. Without ``free`` (not known), scattered room stays scattered; a gang's
    count of nodes that could hold one task stays the smaller request's (``in_own_terms`` counts it
    anew while the cycle runs)."""
    if blocker is None:
        return None
    if blocker.rule == SHORTAGE:
        return restated(blocker, state.need(job, tasks))
    if blocker.rule == PREEMPT_SHARE:  # the fair share is weighed against what one task needs
        return over_share(blocker, state.task_need(job))
    if blocker.rule == NODE_SIZE:  # a task at least as large fits no node either: it is told of its own
        return Blocker(NODE_SIZE, blocker.pool, tasks=tasks, request=job.request, selector=blocker.selector)
    if blocker.rule not in (FRAGMENTED_RULE, GANG):
        return blocker
    pool, request = blocker.pool, job.request
    index = state.indexes.get(pool)
    if index is not None and not any(largest_fit(n, job) for n in matching_nodes(index, job.node_selector)):
        return Blocker(NODE_SIZE, pool, tasks=tasks, request=request, selector=blocker.selector)
    need = state.need(job, tasks)
    if free is None:
        return dataclasses.replace(blocker, need=need, tasks=tasks, request=request)
    return (shortage(pool, need, free[0], free[1], blocker.selector)
            or dataclasses.replace(blocker, free=free[0], need=need, tasks=tasks, request=request))
