"""The preempt action: inside one project and pool, a higher-priority job evicts lower-priority ones."""

from __future__ import annotations

import bisect
from typing import Any, Final, TYPE_CHECKING

from gpud.core.admission import NON_PREEMPTIBLE_ONLY, refuses
from gpud.core.backlog import Group
from gpud.core.shapes import FailedShapes
from gpud.core.evict import ShareLimit, VictimLists, make_room
from gpud.core.memo import Memo
from gpud.core.orders import JobOrder
from gpud.core.pending import gang_tasks, needed_tasks
from gpud.core.queue_walk import Entry, QueueWalk, Skip
from gpud.core.queues import QueueState
from gpud.core.state import Victim
from gpud.core.victim_rooms import least_must
from gpud.core.victims_by_node import VictimsByNode
from gpud.model import EPS, NON_PREEMPTIBLE_PRIORITY, RESOURCES, Evicted, JobSpec, Resources

if TYPE_CHECKING:
    from gpud.core.session import Session

RULE: Final = "preempt"


class Preempt:
    """The preempt action: inside a project, stop lower-priority jobs for higher-priority ones.

    Priority means nothing across projects. A non-preemptible preemptor must
    fit its quota with the other non-preemptible jobs; evictions may also
    bring a project back under its limit. A preemption reorders work inside
    the project's share: it never takes the project (or its department) over
    its fair share in a resource, or further over it, and evicts as many
    lower-priority jobs as that takes (as Slurm's preempt_job_prio does with
    CHECK_FOR_PREEMPTOR_OVERALLOC). Were it to go over, another queue would
    reclaim the preemptor at the next cycle, the victims would take their
    room back the cycle after, and so on.
    """

    def __init__(self, session: Session) -> None:
        self.session = session
        state = self.state = session.state
        self.placer = session.placer
        self.lists = VictimLists(state, session.victim_orders)
        self.failed: dict[QueueState, FailedShapes] = {}  # requests that failed, at their priority
        self.over_quota: dict[QueueState, FailedShapes] = {}  # non-preemptible requests over quota
        # Requests no node's victims could make room for, by the one resource they fell short of;
        # stamped with the department's (or the project's) ``changes`` (see ``_bounded``).
        self.short: Memo[QueueState, FailedShapes] = Memo()
        self.lowest: dict[QueueState, int] = {}  # by queue: the lowest priority among its victims
        self.priority_first = state.backlog.order.priority_first
        self.hopeless = _Hopeless(session, self.failed, self.over_quota, self.short, self.lists,
                                  self.lowest if self.priority_first else None)

    def run(self) -> None:
        """Serve the queues that have victims, each job evicting lower-priority jobs of its queue."""
        state = self.state
        self.lowest.update(self.lowest_priorities())
        walk = QueueWalk(state, state.backlog, queues=self.lowest, admit=self.admit)
        for job in walk:
            skip = self.visit(job)
            if skip is not None:
                walk.pass_over(skip)

    def lowest_priorities(self) -> dict[QueueState, int]:
        """The lowest priority among each queue's victims: preemptible jobs past their minimum run time.

        A job may preempt only above it. (Jobs too young to be victims would
        make whole groups try in vain.)
        """
        lowest: dict[QueueState, int] = {}
        by_queue = self.state.backlog.by_queue
        for queue, running in self.state.running.items():
            if running and queue in by_queue:
                floor = NON_PREEMPTIBLE_PRIORITY  # no preemptible job is this high
                for job in running.values():
                    # The priority test first: most jobs cannot lower the floor, and the age test costs more.
                    if job.priority < floor and not self.lists.too_young(job):
                        floor = job.priority
                if floor < NON_PREEMPTIBLE_PRIORITY:
                    lowest[queue] = floor
        return lowest

    def admit(self, queue: QueueState, heads: list[Entry]) -> list[Entry]:
        """The groups to serve: those whose first job's priority is above the queue's lowest victim's."""
        floor = self.lowest[queue]
        if self.priority_first:  # the heads are sorted by minus the priority first: those above the floor lead
            return heads[:bisect.bisect_left(heads, -floor, key=_minus_priority)]
        return [entry for entry in heads if _group(entry).jobs[0].priority > floor]

    def visit(self, job: JobSpec) -> Skip | None:
        """Try the job; an elastic job running at least its minimum grows one task at a time, each
        preempting as a job of one task would, while its queue stays within its fair share (as in reclaim)."""
        state = self.state
        while True:
            waiting = state.pending_count(job.id)
            skip = self.attempt(job)
            left = state.pending_count(job.id)
            if skip is not None or not left or left == waiting or needed_tasks(state, job)[1] > 0:
                return skip

    def attempt(self, job: JobSpec) -> Skip | None:
        """Place the job's next tasks (its gang minimum, at least one) by evicting lower-priority jobs
        of its queue; the Skip when that fails."""
        state = self.state
        pending, minimum = needed_tasks(state, job)
        if not pending:
            return None
        queue = state.project_queue(job)
        if self.hopeless.holds(job, queue):
            return self.hopeless
        tasks = max(minimum, 1)
        need = state.need(job, tasks)
        if queue.book is not None and queue.book.refusal(job, need.gpu, queue.pool) is not None:
            # A limit per user or project is not for preemption to meet: a victim moved, not stopped, would
            # leave it passed. The job waits with the reason allocation gave.
            return self.hopeless
        failures = self.failed.get(queue) or self.failed.setdefault(queue, FailedShapes(state))
        candidates = self.lists.running_below(queue, job.priority)
        if not self.lists.runs_any(candidates):  # whatever its size: no job of this priority or lower has a victim
            failures.add(job, 1, None, own=-job.priority, binding=())
            return self.hopeless
        refused = refuses(queue, job, need)
        if refused == NON_PREEMPTIBLE_ONLY:
            self.refuse_over_quota(job, queue, tasks, need)
            return self.hopeless
        preemptor = _Preemptor(self.lists, job, queue, need,
                               None if self.priority_first else state.backlog.order)
        limit = ShareLimit(queue)
        must: tuple[float, float, float] | None = None
        if refused is None:
            # The first task alone may take the queue over the limit: then its victims must free the
            # excess on the node it goes to, and make_room would fail, evicting nothing, where none can.
            must = least_must(state, job, limit.must_free(state.task_need(job)))
            if max(must) <= EPS or self.lists.may_free_on_one_node(queue, job.priority, must[0], must[1], must[2]):
                must = None
        if must is None and make_room(self.session, job, candidates, RULE, preemptor.eligible, self.lists,
                                      preemptor.ready, limit, preemptor.holdings):
            self.session.reasons.started(job, queue)
            return None
        self.remember_failure(job, queue, tasks, limit, must)
        return self.hopeless

    def refuse_over_quota(self, job: JobSpec, queue: QueueState, tasks: int, need: Resources) -> None:
        """Remember a non-preemptible job its queue has no quota left for: one as large in a resource
        its queue (or department) has no quota left of is refused too."""
        failures = self.over_quota.get(queue) or self.over_quota.setdefault(queue, FailedShapes(self.state))
        for resource in {r: None for level in (queue, queue.parent) if level is not None
                         for r in level.fixed_excess(need)} or [None]:
            failures.add(job, tasks, None, binding=None if resource is None else (resource,))

    def remember_failure(self, job: JobSpec, queue: QueueState, tasks: int, limit: ShareLimit,
                         short_of: tuple[float, float, float] | None) -> None:
        """Record why the job failed, so a request at least as large at a priority as high is passed over.

        ``short_of`` is what one task's victims must free where no node's
        victims hold that much: a request needing at least as much more of
        such a resource fails too while nothing in the department is placed
        or released, when the queue has no hard bound (``_bounded``).
        """
        explain = limit.explain if limit.stopped else None  # the blocker is made only if someone asks why
        if explain is not None:
            self.session.reasons.overrule_when_read(job.id, queue, explain)
        self.failed[queue].add(job, tasks, None, own=-job.priority, explain=explain)
        if short_of is None or _bounded(queue):
            return
        stamp = (queue.parent or queue).changes
        short = self.short.get(queue, stamp)
        if short is None:
            short = self.short.put(queue, stamp, FailedShapes(self.state))
        most = self.lists.most_held(queue, job.priority)
        for resource, held, must in zip(RESOURCES, most, short_of):
            if held < must - 2 * EPS:
                short.add(job, tasks, None, own=-job.priority, binding=(resource,), explain=explain)


class _Preemptor:
    """A pending job trying to preempt: why its victims go, and whether its queue may take it yet."""

    def __init__(self, lists: VictimLists, job: JobSpec, queue: QueueState, need: Resources,
                 order: JobOrder | None = None) -> None:
        """``order``: the job order, when one of a lower priority may come first in it (aging)."""
        self.lists = lists
        self.job = job
        self.queue = queue
        self.need = need
        self.order = order
        self.key: Any = order.key(job) if order is not None else None

    def eligible(self, victim: Victim) -> Evicted | None:
        """Why the victim goes: the preemptor outranks it. None for a job placed this cycle that comes
        before the preemptor in the job order (one aged past it): the order this cycle served stands."""
        job, order = self.job, self.order
        if order is not None and victim.placed_this_cycle and order.key(victim.job) < self.key:
            return None
        return Evicted(RULE, job.id, self.queue.name, job.priority, victim.job.id, victim.job.priority)

    def ready(self) -> bool:
        """True once the queue's rules let it take the job (evictions may bring it back under them)."""
        return refuses(self.queue, self.job, self.need) is None

    def holdings(self) -> VictimsByNode:
        """At least what the victims below the job's priority hold, by node (``VictimLists.holdings``)."""
        return self.lists.holdings(self.queue, self.job.priority)


class _Hopeless(Skip):
    """Passes over a group whose next job failed as an earlier one of its queue did, at a priority as high;
    with ``lowest`` (the job order sorts by priority first), one whose next job, and so every job after
    it, is no higher than every victim of its queue."""

    def __init__(self, session: Session, failed: dict[QueueState, FailedShapes],
                 over_quota: dict[QueueState, FailedShapes], short: Memo[QueueState, FailedShapes],
                 lists: VictimLists, lowest: dict[QueueState, int] | None) -> None:
        self.state = session.state
        self.reasons = session.reasons
        self.failed = failed
        self.over_quota = over_quota
        self.short = short
        self.lists = lists
        self.lowest = lowest  # by queue: the lowest priority among its victims

    def holds(self, job: JobSpec, queue: QueueState, group: Group | None = None) -> bool:
        if self.lowest is not None and job.priority <= self.lowest[queue]:
            # It may preempt none of its queue's victims: it waits for the reason allocation gave, not
            # for what an earlier job of its group failed to free.
            return True
        state = self.state
        tasks = gang_tasks(state, job)
        number = state.shapes.of_group(group) if group is not None else -1
        failures = self.failed.get(queue)
        found = failures.find(job, tasks, -job.priority, number) if failures is not None else None
        if found is None:
            short = self.short.get(queue, (queue.parent or queue).changes)
            if short is not None:
                found = short.find(job, tasks, -job.priority, number)
                if found is not None and not self.lists.runs_any(self.lists.running_below(queue, job.priority)):
                    # It fails too, but for want of any victim at all: it waits for the reason allocation gave,
                    # as its own try would have left it, not for what a higher job's victims fell short of.
                    return True
        if found is not None:  # learnt from an earlier job: said in this one's terms when read
            self.reasons.spared(job, queue, tasks, found)
            return True
        refused = self.over_quota.get(queue)
        return not job.preemptible and refused is not None and refused.find(job, tasks, 0, number) is not None


def _group(entry: Entry) -> Group:
    """The group of a head."""
    group: Group = entry[2]
    return group


def _minus_priority(entry: Entry) -> int:
    """The first part of a head's key under the built-in job order: minus the priority of the group's first job."""
    return entry[0][0]  # type: ignore[no-any-return]


def _bounded(queue: QueueState) -> bool:
    """True when the queue or its department has a hard limit, or may not go over quota.

    Without either, a preemptor is refused only for non-preemptible jobs
    over quota, so what one task must free decides alone whether its victims
    can make room: a job needing at least as much more of a resource no node's
    victims hold enough of, while nothing in the department is placed or
    released, fails too (``Preempt.short``).
    """
    return queue.bounded or (queue.parent is not None and queue.parent.bounded)
