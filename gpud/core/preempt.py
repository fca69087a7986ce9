"""The preempt action: inside one project and pool, a higher-priority job evicts lower-priority ones."""

from __future__ import annotations

import bisect
from typing import Final, TYPE_CHECKING

from gpud.core.admission import NON_PREEMPTIBLE_ONLY, refusal
from gpud.core.allocate import gang_tasks, needed_tasks, started
from gpud.core.backlog import Group
from gpud.core.shapes import FailedShapes
from gpud.core.evict import ShareLimit, VictimLists, make_room
from gpud.core.order import Entry, Skip, serve_in_order
from gpud.core.orders import job_order_key
from gpud.core.queues import UNLIMITED, QueueState
from gpud.core.state import Victim
from gpud.model import EPS, NON_PREEMPTIBLE_PRIORITY, RESOURCES, Evicted, JobSpec

if TYPE_CHECKING:
    from gpud.core.session import Session

RULE: Final = "preempt"


def preempt(session: Session) -> None:
    """Let each pending job evict preemptible jobs of lower priority in its own queue.

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
    state, placer = session.state, session.placer
    lists = VictimLists(state)
    failed: dict[QueueState, FailedShapes] = {}
    over_quota: dict[QueueState, FailedShapes] = {}
    # Jobs no node's victims could make room for, remembered by the one resource they fell short of;
    # valid while nothing in the department is placed or released (see ``_bounded``).
    short: dict[QueueState, tuple[int, FailedShapes]] = {}
    bounded: dict[QueueState, bool] = {}  # ``_bounded``, asked once per queue: the policy says

    hopeless = _Hopeless(session, failed, over_quota, short)

    def visit(job: JobSpec) -> Skip | None:
        # An elastic job running at least its minimum grows one task at a time, each preempting as a
        # job of one task would, while its queue stays within its fair share (as in reclaim).
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
        if queue.book is not None:
            # A limit per user or project is not for preemption to meet: a victim moved, not stopped, would
            # leave it passed. The job waits with the reason allocation gave.
            limited = queue.book.refusal(job, need.gpu, queue.pool)
            if limited is not None:
                return hopeless
        shapes = failed.get(queue) or failed.setdefault(queue, FailedShapes(state))
        candidates = lists.running_below(queue, job.priority)
        if not candidates:  # whatever its size: no job of this priority or lower has a victim
            shapes.add(job, 1, None, own=-job.priority, binding=())
            return hopeless

        def eligible(victim: Victim) -> Evicted | None:
            return Evicted(RULE, job.id, queue.name, job.priority, victim.job.id, victim.job.priority)

        refused = refusal(queue, job, need)
        if refused is not None and refused[1] == NON_PREEMPTIBLE_ONLY:
            quota_shapes = over_quota.get(queue) or over_quota.setdefault(queue, FailedShapes(state))
            # A non-preemptible job as large in a resource its queue has no quota left of is refused too.
            for resource in {r: None for level in (queue, queue.parent) if level is not None
                             for r in level.fixed_excess(need)} or [None]:
                quota_shapes.add(job, tasks, None, binding=None if resource is None else (resource,))
            return hopeless

        def ready() -> bool:
            return refusal(queue, job, need) is None

        limit = ShareLimit(queue)
        if refused is None:
            # The first task alone may take the queue over the limit: then its victims must free the
            # excess on the node it goes to, and make_room would fail, evicting nothing, where none can.
            must_gpu, must_cpu, must_mem = limit.must_free(state.task_need(job))
            hopeful = (max(must_gpu, must_cpu, must_mem) <= EPS
                       or lists.may_free_on_one_node(queue, job.priority, must_gpu, must_cpu, must_mem))
        else:
            hopeful = True
        if hopeful and make_room(state, placer, job, candidates, RULE, eligible, lists, ready, limit,
                                 lambda: lists.holdings(queue, job.priority)):
            started(session, job, queue)
            return None
        refused_by_limit = limit.refusal
        if refused_by_limit is not None:
            session.reasons[job.id] = (queue, refused_by_limit)
        shapes.add(job, tasks, refused_by_limit, own=-job.priority)
        if queue not in bounded:
            bounded[queue] = _bounded(queue)
        if not hopeful and not bounded[queue]:
            mark = (queue.parent or queue).changes
            known = short.get(queue)
            if known is None or known[0] != mark:
                known = short[queue] = (mark, FailedShapes(state))
            most = lists.most_held(queue, job.priority)
            for resource, held, must in zip(RESOURCES, most, (must_gpu, must_cpu, must_mem)):
                if held < must - 2 * EPS:
                    known[1].add(job, tasks, refused_by_limit, own=-job.priority, binding=(resource,))
        return hopeless

    # A job may preempt only above the lowest priority among its queue's victims: preemptible jobs
    # past their minimum run time. (Jobs too young to be victims would make whole groups try in vain.)
    lowest: dict[QueueState, int] = {}
    for queue, running in state.running.items():
        if running and queue in state.backlog.by_queue:
            floor = NON_PREEMPTIBLE_PRIORITY  # no preemptible job is this high
            for job in running.values():
                # The priority test first: most jobs cannot lower the floor, and the age test costs more.
                if job.priority < floor and not lists.too_young(job):
                    floor = job.priority
            if floor < NON_PREEMPTIBLE_PRIORITY:
                lowest[queue] = floor

    priority_first = state.backlog.job_key is job_order_key

    def admit(queue: QueueState, heads: list[Entry]) -> list[Entry]:
        floor = lowest[queue]
        if priority_first:  # the heads are sorted by minus the priority first: those above the floor lead
            return heads[:bisect.bisect_left(heads, -floor, key=_minus_priority)]
        return [entry for entry in heads if _group(entry).jobs[0].priority > floor]

    serve_in_order(state, state.backlog, visit, admit, queues=lowest)


class _Hopeless(Skip):
    """Passes over a group whose next job failed as an earlier one of its queue did, at a priority as high."""

    def __init__(self, session: Session, failed: dict[QueueState, FailedShapes],
                 over_quota: dict[QueueState, FailedShapes], short: dict[QueueState, tuple[int, FailedShapes]]) -> None:
        self.state = session.state
        self.reasons = session.reasons
        self.failed = failed
        self.over_quota = over_quota
        self.short = short

    def holds(self, job: JobSpec, queue: QueueState, group: Group | None = None) -> bool:
        state = self.state
        tasks = gang_tasks(state, job)
        sid = state.shapes.of_group(group) if group is not None else -1
        shapes = self.failed.get(queue)
        found = shapes.find(job, tasks, -job.priority, sid) if shapes is not None else None
        if found is None:
            known = self.short.get(queue)
            if known is not None and known[0] == (queue.parent or queue).changes:
                found = known[1].find(job, tasks, -job.priority, sid)
        if found is not None:
            if found[0] is not None:
                self.reasons[job.id] = (queue, found[0])
            return True
        refused = self.over_quota.get(queue)
        return not job.preemptible and refused is not None and refused.find(job, tasks, 0, sid) is not None


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
    released, fails too (``short`` in ``preempt``).
    """
    for level in (queue, queue.parent):
        if level is not None and not level.implicit and (level.limit != UNLIMITED or not level.settings.over_quota):
            return True
    return False


class Preempt:
    """The preempt action: inside a project, stop lower-priority jobs for higher-priority ones."""

    def __init__(self, session: Session) -> None:
        self.session = session

    def run(self) -> None:
        """Run the action once over the session's state."""
        preempt(self.session)
