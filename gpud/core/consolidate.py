"""The consolidate action: move running jobs so a job blocked only by scattered free GPUs fits."""

from __future__ import annotations

import bisect
import math
from typing import Final, Iterator, TYPE_CHECKING

from gpud.core.backlog import Backlog, Group
from gpud.core.memo import Memo
from gpud.core.shapes import FailedShapes
from gpud.core.evict import VictimLists
from gpud.core.victim_rooms import wanted_share
from gpud.core.nodes import FreeOrder, NodeState
from gpud.core.pending import gang_tasks, needed_tasks
from gpud.core.queue_walk import QueueWalk, Skip
from gpud.core.placement import Placer, largest_fit
from gpud.core.queues import QueueState
from gpud.core.state import ClusterState, Statement, Victim
from gpud.model import EPS, Evicted, JobSpec, TaskPlacement

if TYPE_CHECKING:
    from gpud.core.session import Session

RULE: Final = "consolidate"
MAX_NODES_TRIED: Final = 16
MAX_JOBS_PER_CYCLE: Final = 32

# A running task that may move: its job and the task's index.
Movable = tuple[JobSpec, int]


class Consolidate:
    """The consolidate action: move running tasks to make room for a pending job that fits nowhere
    only because free resources are scattered.

    For pending jobs that would fit in the pool's free capacity, a node is
    cleared by moving others. A move happens only if every moved job is
    placed again in the same cycle; among the nodes that could be cleared,
    the one needing the fewest moves wins. With an order that weighs lost
    work, moves never lose more than the policy's ``max_move_lost_hours``
    of the job's GPUs.
    """

    def __init__(self, session: Session) -> None:
        self.session = session
        state = self.state = session.state
        self.placer = session.placer
        self.lists = VictimLists(state, session.victim_orders)
        self.failed = FailedShapes(state)
        self.hopeless = _Hopeless(state, self.failed)
        # Each node's movable tasks for any job, stamped with the node's ``version`` (without veto plugins).
        self._movable: Memo[str, list[Movable]] = Memo()
        self.free_orders: dict[str, FreeOrder] = {}  # by pool: the nodes by free GPU share (``most_free_first``)

    def run(self) -> None:
        """Serve the jobs allocation found fragmented, in queue order."""
        state, fragmented = self.state, self.session.reasons.fragmented
        if not fragmented:
            return
        blocked = Backlog(state.policies.job_order, state.job_specific_plugins)
        for job_id in fragmented:
            job = state.jobs[job_id]
            blocked.add(job, state.project_queue(job), partly_running=len(needed_tasks(state, job)[0]) < job.tasks)
        walk = QueueWalk(state, blocked)
        for job in walk:
            skip = self.visit(job)
            if skip is not None:
                walk.pass_over(skip)

    def visit(self, job: JobSpec) -> Skip | None:
        """Place the job's next tasks (its gang minimum, else one), each on free room or on a node
        cleared for it; all or none. The Skip when that fails."""
        state, hopeless = self.state, self.hopeless
        pending, minimum = needed_tasks(state, job)
        queue = state.project_queue(job)
        if not pending or not job.request.uses_gpu or hopeless.holds(job, queue):
            return hopeless
        if minimum == 0 and len(pending) < job.tasks:
            return None
        tasks = pending[:max(minimum, 1)] if minimum else pending[:1]
        need = state.need(job, len(tasks))
        book = queue.book
        limited = book.refusal(job, need.gpu, state.pool_of(job)) if book is not None else None
        if limited is not None:  # a limit reached since allocation found it fragmented: it waits for that now
            self.session.reasons.waits(job.id, queue, limited[0])
            return None
        index = state.indexes.get(state.pool_of(job))
        if index is None or index.free_gpu + EPS < need.gpu:
            self.failed.add(job, len(tasks), None)
            return hopeless
        hopeless.attempts += 1
        stmt = self.session.statement()
        for task in tasks:
            placement = self.placer.find(job)
            if placement is not None:
                stmt.bind(job, task, placement)
            elif not self.clear_node_for(stmt, job, task):
                stmt.rollback()
                self.failed.add(job, len(tasks), None)
                return hopeless
        if not self.session.planner.keeps():  # it would delay a reservation (gpud.core.reservations)
            stmt.rollback()
            return None
        self.session.reasons.started(job, queue)
        return None

    def clear_node_for(self, stmt: Statement, job: JobSpec, task: int) -> bool:
        """Move the fewest tasks off one node so task ``task`` of ``job`` fits there; True on success.

        Among nodes cleared by as many moves, the one whose moved tasks come
        first in the victim order wins (lowest priority, most recently started;
        with ``least_lost_work``, the least work lost). Each node's tasks are
        tried the largest GPU holders first; where that clears the node, with
        an order that weighs lost work (``VictimOrder.weighs_lost_work``), each
        task there that checkpointed in its current run is tried alone too,
        the first in the order first: a move stops and restarts the job, and
        a job moved right after its checkpoint loses nearly nothing. Jobs that
        never checkpointed are not tried alone, and no node is cleared that
        the largest holders could not clear. With that order, moves that
        would lose more than the policy's bound (``move_loss_bound``) are
        not made: the job waits for room instead.
        """
        placer, lists = self.placer, self.lists
        weigh = lists.weighs_lost_work
        bound = move_loss_bound(self.state.policy.max_move_lost_hours, job) if weigh else math.inf
        best: tuple[int, list[tuple], NodeState, list[Movable], list[Movable]] | None = None
        tried = 0
        for node in self.most_free_first(self.state.pool_of(job)):
            self.state.turns.step()
            if tried >= MAX_NODES_TRIED:
                break
            if not (largest_fit(node, job) and node.matches(job.node_selector)):
                continue
            movable = self.movable(job, node)
            if not movable:
                continue
            tried += 1
            if not _might_clear(placer, job, node, movable):
                continue
            found = self._trial(stmt, job, task, node, movable)
            if found is None:
                continue
            if self._within(found[4], bound) and (best is None or found[:2] < best[:2]):
                best = found
            if weigh:
                for item in self._checkpointed_in_order(movable):
                    if best is not None and best[0] == 1 and [lists.key_of(item[0], [item[1]])] >= best[1]:
                        break  # the one move already found loses no more than this one would
                    if self._within([item], bound) and _might_clear(placer, job, node, [item]):
                        found = self._trial(stmt, job, task, node, [item])
                        if found is not None and (best is None or found[:2] < best[:2]):
                            best = found
        if best is None:
            return False
        return self.try_node(stmt, job, task, best[2], best[3]) is not None

    def _within(self, moved: list[Movable], bound: float) -> bool:
        """Whether moving these tasks loses at most ``bound`` GPU-seconds; not worked out without a bound."""
        return bound == math.inf or self._lost(moved) <= bound

    def _lost(self, moved: list[Movable]) -> float:
        """The GPU-seconds the jobs of the moved tasks lose in all (``Victim.lost_gpu_seconds``), each job once."""
        state = self.state
        seen: set[str] = set()
        total = 0.0
        for other, other_task in moved:
            if other.id not in seen:
                seen.add(other.id)
                total += Victim(other, None, [other_task], state.now).lost_gpu_seconds
        return total

    def _trial(self, stmt: Statement, job: JobSpec, task: int, node: NodeState,
               order: list[Movable]) -> tuple[int, list[tuple], NodeState, list[Movable], list[Movable]] | None:
        """What moving tasks of ``order`` off ``node``, in order, would take (nothing is changed): how many
        move, their victim keys (the last in the victim order first), the node, the order and the tasks
        that move; None when that makes no room for the task."""
        mark = stmt.checkpoint()
        moved = self.try_node(stmt, job, task, node, order)
        stmt.rollback(mark)
        if moved is None:
            return None
        lists = self.lists
        keys = sorted([lists.key_of(other, [other_task]) for other, other_task in moved], reverse=True)
        return len(moved), keys, node, order, moved

    def _checkpointed_in_order(self, movable: list[Movable]) -> list[Movable]:
        """The movable tasks whose jobs checkpointed since they last started, first in the victim order first."""
        lists = self.lists
        found = [item for item in movable if _checkpointed_this_run(item[0])]
        found.sort(key=lambda item: lists.key_of(item[0], [item[1]]))
        return found

    def movable(self, job: JobSpec, node: NodeState) -> list[Movable]:
        """The tasks on ``node`` that may move for ``job``, the largest GPU holders first.

        Without veto plugins the answer is the same for every job (but its
        own tasks) until the node changes: it is kept, stamped with the node's version.
        """
        if self.lists.vetoes:
            return self._movable_tasks(job, node, job.id)
        found = self._movable.get(node.name, node.version)
        if found is None:
            found = self._movable.put(node.name, node.version, self._movable_tasks(job, node, ""))
        return [item for item in found if item[0].id != job.id]

    def _movable_tasks(self, job: JobSpec, node: NodeState, exclude: str) -> list[Movable]:
        """The preemptible tasks on ``node`` no rule protects from moving for ``job``, but those of job ``exclude``."""
        state, lists = self.state, self.lists
        found = []
        for job_id, task in list(node.tasks):
            other = state.jobs.get(job_id)
            if other is None:  # room held for a reservation (gpud.core.reservations): it never moves
                continue
            if not other.preemptible or other.id == exclude or other.id in state.orphans:
                continue  # a job of a project gone from the policy runs on where it is until it ends
            if not lists.vetoes:
                if not lists.too_young(other):
                    found.append((other, task))
            elif lists.protected(Victim(other, state.queue_of(other), [task], state.now), job, RULE) is None:
                found.append((other, task))
        # The largest GPU holders first (fewest moves); among equals, the victim order's first.
        found.sort(key=lambda item: (-(node.tasks[(item[0].id, item[1])].gpu_share
                                       * len(node.tasks[(item[0].id, item[1])].gpu_index)),
                                     lists.key_of(item[0], [item[1]])))
        return found

    def most_free_first(self, pool: str) -> Iterator[NodeState]:
        """The pool's nodes, most free GPU share first, in pool order among equals, as they stand when asked.

        The order is made once per cycle, then only the nodes changed since
        (their ``version``) move, once something was placed or released
        (``ClusterState.changes``). Kept from one cycle to the next, it
        saved 0.7 ms of a 95 ms warm cycle of bench/scheduler_cycle.py's big
        cluster: not worth a cache the state must carry.
        """
        state = self.state
        nodes = state.indexes[pool].nodes
        known = self.free_orders.get(pool)
        if known is None or known.nodes is not nodes:
            known = self.free_orders[pool] = FreeOrder(nodes, state.changes)
        elif known.changes != state.changes:
            known.changes = state.changes
            sums, versions = known.sums, known.versions
            ordered: list[tuple[float, int, NodeState]] | None = None
            for i, node in enumerate(nodes):
                if node.version != versions[i]:
                    versions[i] = node.version
                    if ordered is None:  # a new list: an iteration of the old one may still be under way
                        ordered = list(known.ordered)
                    # The entries are unique (the index is in them): each changed one moves to its new place.
                    del ordered[bisect.bisect_left(ordered, sums[i])]
                    sums[i] = (-sum(node.free_share), i, node)
                    bisect.insort(ordered, sums[i])
            if ordered is not None:
                known.ordered = ordered
        for entry in known.ordered:  # a list made anew whenever it changes: callers may move tasks meanwhile
            yield entry[2]

    def try_node(self, stmt: Statement, job: JobSpec, task: int, node: NodeState,
                 movable: list[Movable]) -> list[Movable] | None:
        """Move tasks off ``node``, in order, until task ``task`` of ``job`` fits there, then place each
        taken task again; the tasks that moved (one placed again where it was did not), or None (nothing
        changed) when that does not work out."""
        placer, placements = self.placer, self.state.placements
        mark = stmt.checkpoint()
        taken: list[tuple[JobSpec, int, TaskPlacement]] = []  # each task taken off and where it was
        placement = None
        for other, other_task in movable:
            was = placements[other.id][other_task]
            assert was is not None, f"task {other_task} of {other.id} is movable but not placed"
            stmt.evict(other, other_task, RULE, Evicted(RULE, job.id, node=node.name), job.id)
            taken.append((other, other_task, was))
            placement = placer.fit_on(job, node)
            if placement is not None:
                break
        if placement is None:
            stmt.rollback(mark)
            return None
        stmt.bind(job, task, placement)
        moved: list[Movable] = []
        for other, other_task, was in taken:
            found = placer.find(other)
            if found is None or self._past_limit(other, found, _gpus_held(was)):
                stmt.rollback(mark)
                return None
            stmt.bind(other, other_task, found)
            if found != was:
                moved.append((other, other_task))
        return moved

    def _past_limit(self, job: JobSpec, placement: TaskPlacement, held: float) -> bool:
        """Whether the moved task, holding more GPUs where it lands than before (a memory slice on smaller
        GPUs), would take its user or project past a limit; its task is off the book meanwhile."""
        book = self.state.book
        gpus = _gpus_held(placement)
        return book is not None and gpus > held + EPS and book.refusal(job, gpus) is not None


class _Hopeless(Skip):
    """Passes over a group whose next job failed as an earlier one did, and every job once the cycle
    has tried ``MAX_JOBS_PER_CYCLE``."""

    def __init__(self, state: ClusterState, failed: FailedShapes) -> None:
        self.state = state
        self.failed = failed
        self.attempts = 0

    def holds(self, job: JobSpec, queue: QueueState, group: Group | None = None) -> bool:
        state = self.state
        return (self.attempts >= MAX_JOBS_PER_CYCLE
                or self.failed.find(job, gang_tasks(state, job), 0,
                                    state.shapes.of_group(group) if group is not None else -1) is not None)


def move_loss_bound(hours: float, job: JobSpec) -> float:
    """The most GPU-seconds the moves that make room for ``job`` may lose: ``hours`` of the job's GPUs (all
    its tasks'), counting at least one GPU, so that a fraction or a CPU-only job has the bound of one GPU."""
    return hours * 3600.0 * max(job.request.gpus * job.tasks, 1.0)


def _checkpointed_this_run(job: JobSpec) -> bool:
    """Whether the running job reported a checkpoint since it last started."""
    checkpointed = job.checkpointed
    if checkpointed is None:
        return False
    started = job.started if job.started is not None else job.submitted
    return checkpointed > started


def _gpus_held(placement: TaskPlacement | None) -> float:
    """The GPUs a task placed so holds (its share of each of its GPUs)."""
    return placement.gpu_share * len(placement.gpu_index) if placement is not None else 0.0


def _cleared(node: NodeState, movable: list[Movable]) -> tuple[list[float], float, float]:
    """The node's free share of each GPU, free CPUs and memory were every movable task gone (nothing is changed)."""
    share, cpu, mem = list(node.free_share), node.free_cpu, node.free_mem
    out_of_service = node.spec.out_of_service
    for other, task in movable:
        placement = node.tasks[(other.id, task)]
        for i in placement.gpu_index:
            if i not in out_of_service:
                share[i] = min(1.0, share[i] + placement.gpu_share)
        cpu += other.request.cpus
        mem += other.request.memory_gib
    return share, cpu, mem


def _might_clear(placer: Placer, job: JobSpec, node: NodeState, movable: list[Movable]) -> bool:
    """False when moving tasks off ``node`` cannot make room there for one task of ``job``; True promises nothing.

    Told without moving anything (so without undoing it): either the task
    would not fit even with every movable task gone, or the first task to
    move has nowhere to go: no room anywhere now, and the node would keep
    too little beside the job's task.
    """
    request = job.request
    share, cpu, mem = _cleared(node, movable)
    if request.cpus > cpu + EPS or request.memory_gib > mem + EPS:
        return False
    if request.uses_gpu:
        if request.is_shared:
            want = wanted_share(request, node.gpu_memory_gib)
            if want is None or max(share, default=0.0) < want:
                return False
        elif sum(1 for free in share if free >= 1.0 - EPS) < request.whole_gpus:
            return False
    first = movable[0][0]
    other = first.request
    gpu = sum(share) - (request.gpus if request.gpu_memory_gib is None else request.gpu_share_on(node.gpu_memory_gib))
    if (other.cpus <= cpu - request.cpus + EPS and other.memory_gib <= mem - request.memory_gib + EPS
            and (other.gpus if other.gpu_memory_gib is None else other.gpu_share_on(node.gpu_memory_gib)) <= gpu + EPS):
        return True  # it might go back beside the job's task (the cheaper question first)
    return placer.find(first) is not None
