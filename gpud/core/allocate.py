"""The allocate action: place pending jobs into free resources, most deprived queue first."""

from __future__ import annotations

import heapq
from typing import TYPE_CHECKING, Final, Iterator

from gpud.core.admission import refusal
from gpud.core.backlog import Group
from gpud.core.limits import USER_ONLY
from gpud.core.pending import gang_tasks, needed_tasks
from gpud.core.placement import FRAGMENTED, WAITING, explain_unplaced
from gpud.core.queue_walk import QueueWalk, Skip
from gpud.core.queues import QueueState
from gpud.core.recorder import Learnt, PassedOver
from gpud.core.reservations import Planner
from gpud.core.shapes import Failure, FailedShapes, failure_dims, first_covering, shape_key
from gpud.core.state import ClusterState, Statement
from gpud.model import EPS, Blocker, JobSpec

if TYPE_CHECKING:
    from gpud.core.session import Session


ROOM_KINDS: Final = (WAITING, FRAGMENTED)  # failures for lack of free room now, not of a rule or a size
LOOKS: Final = 16  # jobs of a queue looked at in a row for one more estimate after the walk


class Allocate:
    """The allocate action: bind every pending job that fits into free resources, most deprived queue
    first, and record why each job it takes and cannot place waits.

    A job that finds no room (or that a queue rule refuses) is remembered
    by its shape (``Blocks``): the rest of its queue's jobs at least as
    large are passed over without a search, and a queue whose every job is
    that large is passed over whole. Each job's binds go through a statement
    of its own, as KAI-Scheduler's allocate opens one per job: a job's
    tasks are bound all together or not at all, and no job's undo outlives it.
    """

    def __init__(self, session: Session) -> None:
        self.session = session
        self.state = session.state
        self.placer = session.placer
        self.reasons = session.reasons
        self.blocks = Blocks(self.state)
        self.planner = session.planner
        self.blocked_as_before = _BlockedAsBefore(session, self.blocks, self.planner)
        self._tried: tuple[list[int], int] = ([], 0)

    def run(self) -> None:
        """Walk the backlog, placing each job that fits; one that does not blocks the like of it, and
        the first that find no room get their start planned (gpud.core.reservations): the room they
        need is held from later jobs that would delay them, and from the later actions, until the
        cycle's actions are over (``Session.release_held``)."""
        walk = QueueWalk(self.state, self.state.backlog, drop=self.blocks_whole_queue)
        for job in walk:
            if not self.allocate(job):
                walk.pass_over(self.blocked_as_before)
        if self.planner.active:
            self.estimate_the_rest()

    def estimate_the_rest(self) -> None:
        """Plan the starts of waiting jobs the walk passed over with their group or queue, while their
        pools plan more (``estimate_jobs``): each queue's in its order, the queues in turn. Only a job
        that waits for room gets one; none of them holds room."""
        state, planner = self.state, self.planner
        touched, placements = state.touched, state.placements
        runs = []
        for queue, groups in state.backlog.by_queue.items():
            if planner.plans_more(queue.pool):
                runs.append((queue, _in_order(list(groups.values()))))
        while runs:
            left = []
            for queue, jobs in runs:
                if not planner.plans_more(queue.pool):
                    continue
                # A queue's turn ends with its next job planned; one whose next jobs wait on a queue rule,
                # or never fit, gives up its turns after a few.
                for _, job in zip(range(LOOKS), jobs):
                    if job.id in touched and None not in placements[job.id]:
                        continue  # started this cycle
                    tasks = gang_tasks(state, job)
                    found = self.blocks.find(job, queue, tasks)
                    if found is not None and found.kind in ROOM_KINDS and planner.plan_new(job, tasks):
                        left.append((queue, jobs))
                        break
            runs = left

    def allocate(self, job: JobSpec) -> bool:
        """Place the job's pending tasks if they fit and no earlier failure says they cannot; else
        record why it waits. True when placed."""
        state = self.state
        queue = state.project_queue(job)
        tasks = gang_tasks(state, job)
        planner = self.planner
        known = self.blocks.find(job, queue, tasks)
        if known is not None and known.kind in ROOM_KINDS and planner.active and planner.may_borrow(job, tasks):
            known = None  # it found no room beside the room held, but it may borrow that
        if known is not None:
            self.reasons.learnt(job, queue, tasks, known)
            return False
        waiting = state.pending_tasks(job.id) if planner.active else []
        stmt = self.session.statement()
        found = self.place(stmt, job, queue, tasks)
        if found is None:
            planner.placed(job, waiting)
            self.reasons.started(job, queue)
            return True
        blocker, kind = found
        if planner.active and kind in ROOM_KINDS:
            pending, minimum = self._tried
            if planner.borrow(stmt, job, tasks, lambda: self.placer.place(stmt, job, pending, minimum) > 0):
                self.reasons.started(job, queue)
                return True
            plan_start(state, planner, job, queue, tasks)
        self.reasons.waits(job.id, queue, blocker)
        return False

    def place(self, stmt: Statement, job: JobSpec, queue: QueueState,
              tasks: int) -> tuple[Blocker | None, str] | None:
        """Place the job's pending tasks into free room, as many as fit of an elastic job, if the queue
        rules let its queue take them: None when placed, else (blocker, kind) of the failure,
        remembered for the jobs that come after (``tasks``: how many must start together)."""
        state = self.state
        pending, minimum = needed_tasks(state, job)
        refused = refusal(queue, job, state.need(job, len(pending)))
        if refused and minimum < len(pending):  # an elastic job may start with its minimum
            pending = pending[:max(minimum, 1)]
            refused = refusal(queue, job, state.need(job, len(pending)))
        if refused:
            refusing, binds = refused
            if binds != USER_ONLY:  # a user's limit says nothing of the other users' jobs of its shape
                self.blocks.refuse(job, queue, tasks, refusing, binds)
            return refusing, ""
        self._tried = (pending, max(minimum, 1))
        if self.placer.place(stmt, job, pending, max(minimum, 1)):
            return None
        blocker, kind = explain_unplaced(state, job, tasks)
        self.blocks.room.add(job, tasks, blocker, kind)
        if kind == FRAGMENTED:
            self.reasons.found_fragmented(job.id)
        return blocker, kind

    def blocks_whole_queue(self, queue: QueueState) -> bool:
        """True when every job the queue has left is blocked as an earlier one was; then how each of
        them waits is kept, to be worked out when read (``LateReasons``)."""
        # Room held for a reservation may be borrowed by a job that ends soon enough: then the smallest
        # groups (``QueueCovers`` compares time limits too) must each be unable to borrow as well.
        planner = self.planner
        borrow = planner if planner.active and planner.holds_room(queue.pool) else None
        if not self.blocks.blocks_all(queue, borrow):
            return False
        self.reasons.queue_passed_over(queue, self.blocks.late_reasons(queue))
        return True


class _BlockedAsBefore(Skip):
    """Passes over a group whose next job is blocked by an earlier failure of the action (``Blocks``);
    the reason is the whole group's (``ReasonRecorder.group_learnt_from``): its jobs share their shape."""

    def __init__(self, session: Session, blocks: Blocks, planner: Planner) -> None:
        self.planner = planner
        self.state = session.state
        self.reasons = session.reasons
        self.blocks = blocks

    def holds(self, job: JobSpec, queue: QueueState, group: Group | None = None) -> bool:
        state = self.state
        tasks = gang_tasks(state, job)
        sid = state.shapes.of_group(group) if group is not None else -1
        found = self.blocks.find(job, queue, tasks, sid)
        if found is None or (found.kind in ROOM_KINDS and self.planner.active
                             and self.planner.may_borrow(job, tasks, sid)):
            return False
        if group is not None:
            self.reasons.group_learnt_from(group, job, queue, tasks, found, sid)
        else:
            self.reasons.learnt(job, queue, tasks, found)
        return True


class Blocks:
    """Why jobs cannot start this action: shapes that found no room, and queue rules that refused.

    A job at least as large as a blocked one, in the same pool (and, for
    queue rules, the same queue and bound by the same rule), is blocked too.
    """

    def __init__(self, state: ClusterState) -> None:
        self.state = state
        self.room = FailedShapes(state)
        self.rules: dict[QueueState, FailedShapes] = {}

    def find(self, job: JobSpec, queue: QueueState, tasks: int, sid: int = -1) -> Failure | None:
        """The earlier failure that blocks the job (its blocker and kind), else None (``sid``: its shape's
        number, when known)."""
        found = self.room.find(job, tasks, 0, sid)
        if found is None and queue in self.rules:
            found = self.rules[queue].find(job, tasks, 0 if job.preemptible else 1, sid)
        return found

    def refuse(self, job: JobSpec, queue: QueueState, tasks: int, reason: Blocker, binds: int) -> None:
        """Remember a queue rule that refused the job (``binds``: EVERY_JOB or NON_PREEMPTIBLE_ONLY)."""
        rules = self.rules.get(queue) or self.rules.setdefault(queue, FailedShapes(self.state))
        rules.add(job, tasks, reason, "", binds)

    def blocks_all(self, queue: QueueState, borrow: Planner | None = None) -> bool:
        """True when every pending job of the queue is blocked: each of its smallest requests is (and,
        with ``borrow``, the planner of a pool that holds room, may not borrow that room either: a job
        that ends later or is larger may not when they may not)."""
        cover = self.state.covers.of(queue)
        if not cover:
            return False
        for group in cover:
            job = group.jobs[0]
            tasks = max(job.gang_minimum, 1)
            found = self.find(job, queue, tasks)
            if found is None or (borrow is not None and found.kind in ROOM_KINDS and borrow.may_borrow(job, tasks)):
                return False
        return True

    def late_reasons(self, queue: QueueState) -> LateReasons:
        """Why the queue's jobs wait, as the failures remembered now say, worked out when asked."""
        rules = self.rules.get(queue)
        free = {pool: (index.free_gpu, index.free_cpu) for pool, index in self.state.indexes.items()}
        return LateReasons(self.state, queue, self.room.frozen(), rules.frozen() if rules is not None else {}, free)


class LateReasons(PassedOver):
    """The reasons of jobs passed over with their whole queue, from a copy of the failures at that moment.

    Read after the cycle, perhaps while the next one runs: it reads the
    copy and the job, never what the next cycle changes.
    """

    def __init__(self, state: ClusterState, queue: QueueState, room: dict, rules: dict,
                 free: dict[str, tuple[float, float]]) -> None:
        self.state = state
        self.queue = queue
        self.room = room
        self.rules = rules
        self.free = free  # each pool's free GPUs and CPUs at that moment

    def of(self, job: JobSpec) -> Learnt | None:
        """The failure remembered then that covers a job of the queue that has not started; None if none."""
        state = self.state
        klass, base = shape_key(job, state.pool_of(job), state.job_specific_plugins)
        tasks = max(job.gang_minimum, 1)
        found = first_covering(self.room, klass, failure_dims(base, tasks))
        if found is None:
            found = first_covering(self.rules, klass, failure_dims(base, tasks, 0 if job.preemptible else 1))
        if found is None:
            return None
        blocker = found.blocker
        free = self.free.get(blocker.pool) if blocker is not None and not blocker.selector else None
        return Learnt(self.queue, blocker, tasks, free)


def _in_order(groups: list[Group]) -> Iterator[JobSpec]:
    """The jobs of one queue's groups, in the queue's job order."""
    heap = [(group.keys[0], group.seq, 0, group) for group in groups if group.jobs]
    heapq.heapify(heap)
    while heap:
        _, seq, i, group = heapq.heappop(heap)
        yield group.jobs[i]
        if i + 1 < len(group.jobs):
            heapq.heappush(heap, (group.keys[i + 1], seq, i + 1, group))


def plan_start(state: ClusterState, planner: Planner, job: JobSpec, queue: QueueState, tasks: int) -> None:
    """Plan the start of a job that finds no room now (``Planner.plan``); it may hold room only for
    what its queue's fair share entitles it to."""
    fair = queue.fair_share.gpu
    planner.plan(job, tasks, not job.request.uses_gpu or state.need(job, tasks).gpu <= fair + EPS)
