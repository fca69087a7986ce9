"""Making room by eviction: try victims one by one on a statement, commit only if the job then fits."""

from __future__ import annotations

import heapq
from typing import TYPE_CHECKING, Callable, Iterable, Iterator

from gpud.core.hooks import has_implementations
from gpud.core.memo import Memo
from gpud.core.pending import needed_tasks
from gpud.core.blockers import PREEMPT_OVER, PREEMPT_SHARE
from gpud.core.queues import QueueState
from gpud.core.state import ClusterState, Victim
from gpud.core.victim_rooms import NodeRoom, cheapest_room, enough_held, least_must, must_gpu_on
from gpud.core.victims_by_node import VictimsByNode
from gpud.model import EPS, RESOURCES, Blocker, Evicted, JobSpec, Resources, TaskPlacement

if TYPE_CHECKING:
    from gpud.core.session import Session

Eligibility = Callable[[Victim], Evicted | None]
# (the victim-order plugin's key, tiebreak, victim). Typed as a plain tuple, as gpud.core.queue_walk's Entry is.
VictimEntry = tuple


class VictimLists:
    """Each queue's evictable running jobs in victim order, sorted once per action.

    Jobs too young to be victims (minimum run time) are left out when a
    list is built; a cursor per queue moves past the jobs already evicted at
    its front, so walking a list again costs only what is still there.
    ``orders`` keeps each queue's sorted list for the cycle's next action,
    stamped with the queue's ``changes`` (gpud.core.memo).
    """

    def __init__(self, state: ClusterState, orders: Memo[QueueState, list[VictimEntry]]) -> None:
        self.state = state
        self._order = state.policies.victim_order
        self.weighs_lost_work = self._order.weighs_lost_work  # room is chosen by the work its victims lose
        self._veto = state.hook.gpud_can_evict if has_implementations(state.hook.gpud_can_evict) else None
        self.vetoes = self._veto is not None
        self._orders = orders
        self._lists: dict[QueueState, list[VictimEntry]] = {}  # this action's list of each queue
        self._cursor: dict[QueueState, int] = {}
        # (priority, job id, victim) of each entry of ``_lists``, made once per list.
        self._flat: dict[QueueState, list[tuple[int, str, Victim]]] = {}
        self._usable: dict[int, dict[int, bool]] = {}  # by shape number: by node kind, whether a task fits
        # By (queue, priority): the victims of the queue's list below the priority, picked out once per action.
        self._below: dict[tuple[QueueState, int], list[Victim]] = {}
        self._held: Memo[tuple[QueueState, int], VictimsByNode] = Memo()  # stamp: the queue's gains
        self._most: Memo[tuple[QueueState, int], tuple[float, float, float]] = Memo()  # stamp: the queue's gains
        self._gains: dict[QueueState, int] = {}  # binds of the queue's victims onto new room, this action
        self._min_runtime = state.policy.min_runtime_s

    def key_of(self, job: JobSpec, tasks: list[int]) -> tuple:
        """Where a running job stands in the victim order (the victim-order plugin's key): smaller goes first."""
        victim = Victim(job, self.state.queue_of(job), tasks, self.state.now)
        found: tuple = self._order.key(victim)
        return found

    def too_young(self, job: JobSpec) -> bool:
        """True for a job that has not run the minimum run time (one placed this cycle has not started)."""
        started = job.started if job.started is not None else job.submitted
        return self.state.now - started < self._min_runtime - EPS and job.is_running

    def ordered(self, queue: QueueState) -> list[VictimEntry]:
        """(key, n, victim) triples of one queue's evictable jobs, first victim first.

        A job placed earlier in the same cycle counts as started just now, so
        it comes first among jobs of its priority: undoing it loses no work.
        The list is made once per action; the next action of the cycle takes
        it again if no task of the queue was placed or released since.
        """
        found = self._lists.get(queue)
        if found is None:
            found = self._orders.get(queue, queue.changes)
            if found is None:
                found = self._orders.put(queue, queue.changes, self._sorted(queue))
            self._lists[queue] = found
            self._cursor[queue] = 0
        return found

    def _sorted(self, queue: QueueState) -> list[VictimEntry]:
        """The queue's running preemptible jobs old enough to be victims, as sorted (key, n, victim) entries."""
        order, turns = self._order, self.state.turns
        entries: list[VictimEntry] = []
        for victim in self.state.victims(queue, preemptible_only=True, too_young=self.too_young):
            turns.step()
            # (key, n) pairs are unique, so the victims themselves are never compared.
            entries.append((order.key(victim), len(entries), victim))
        return sorted(entries)

    def _start(self, queue: QueueState) -> tuple[list[VictimEntry], int]:
        """A queue's entries and where its running ones begin, moving its cursor past the evicted at the front.

        Called between statements only (or, reading lazily, before the
        statement evicts from the queue): a job evicted by an open statement
        comes back if it is rolled back.
        """
        entries = self.ordered(queue)
        placements, touched = self.state.placements, self.state.touched
        i = self._cursor[queue]
        # A victim is a job that ran when its list was made: one untouched this cycle still runs.
        while i < len(entries) and (job_id := _victim(entries[i]).job.id) in touched and not any(placements[job_id]):
            i += 1
        self._cursor[queue] = i
        return entries, i

    def _running(self, queue: QueueState) -> Iterator[VictimEntry]:
        """The entries of a queue whose job still runs."""
        entries, i = self._start(queue)
        placements, touched = self.state.placements, self.state.touched
        for entry in entries[i:]:
            job_id = _victim(entry).job.id
            if job_id not in touched or any(placements[job_id]):
                yield entry

    def running_below(self, queue: QueueState, priority: int) -> list[Victim]:
        """The victims of one queue that have a lower priority, in victim order: every one that still ran
        when first asked in this action, so some may have stopped since (``runs_any``).

        Picked out of the queue's list once per action, never again as the
        queue changes (a preemption changes it at every try). A stopped job
        holds no placement: the searches for room pass it over, and evictions
        ask whether it still runs.
        """
        key = (queue, priority)
        below = self._below.get(key)
        if below is None:
            entries, i = self._start(queue)
            placements, touched = self.state.placements, self.state.touched
            flat = self._flat.get(queue)
            if flat is None:
                flat = self._flat[queue] = [(v.job.priority, v.job.id, v) for v in map(_victim, entries)]
            below = self._below[key] = [victim for level, job_id, victim in flat[i:] if level < priority
                                        and (job_id not in touched or any(placements[job_id]))]
        return below

    def runs_any(self, victims: list[Victim]) -> bool:
        """True when the job of one of the victims holds a placement now."""
        placements = self.state.placements
        for victim in victims:
            if any(placements[victim.job.id]):
                return True
        return False

    def may_free_on_one_node(self, queue: QueueState, priority: int, gpu: float, cpu: float, mem: float) -> bool:
        """False when no node holds, in victims of ``queue`` below ``priority``, this many GPUs, CPUs and
        memory: no eviction among them then frees that much where one task goes.

        What each node holds is summed up as ``holdings`` says.
        """
        gpu, cpu, mem = gpu - 2 * EPS, cpu - 2 * EPS, mem - 2 * EPS  # sums may round apart from make_room's
        for held_gpu, held_cpu, held_mem in self.holdings(queue, priority).held.values():
            if held_gpu >= gpu and held_cpu >= cpu and held_mem >= mem:
                return True
        return False

    def holdings(self, queue: QueueState, priority: int) -> VictimsByNode:
        """At least what the victims of ``queue`` below ``priority`` hold now (GPUs, CPUs, memory), by node,
        and which of them sit on each node (``VictimsByNode``, made from ``running_below``'s list).

        Summed up once, and used for the rest of the action as long as no
        victim of the queue is placed anew (``gained``): evictions only take
        from what the victims hold, and a rollback or a victim put back on
        its own GPUs gives back no more than they held.
        """
        gains = self._gains.get(queue, 0)
        found = self._held.get((queue, priority), gains)
        if found is None:
            found = self._held.put((queue, priority), gains,
                                   VictimsByNode(self.running_below(queue, priority), self.state.placements))
        return found

    def most_held(self, queue: QueueState, priority: int) -> tuple[float, float, float]:
        """The most GPUs, CPUs and memory the victims of ``queue`` below ``priority`` hold on any one
        node, each resource on its own, as ``holdings`` sums them up."""
        gains = self._gains.get(queue, 0)
        found = self._most.get((queue, priority), gains)
        if found is not None:
            return found
        gpu = cpu = mem = 0.0
        for held_gpu, held_cpu, held_mem in self.holdings(queue, priority).held.values():
            gpu, cpu, mem = max(gpu, held_gpu), max(cpu, held_cpu), max(mem, held_mem)
        return self._most.put((queue, priority), gains, (gpu, cpu, mem))

    def gained(self, queue: QueueState | None) -> None:
        """Note that a job that may be among the queue's victims was placed where it did not run.

        The one place the queue's gains are counted: ``holdings`` and
        ``most_held`` are stamped with that count.
        """
        if queue is not None:
            self._gains[queue] = self._gains.get(queue, 0) + 1

    def of_queues(self, queues: Iterable[QueueState]) -> Iterator[Victim]:
        """The running victims of several queues, merged in one victim order, read as they are needed."""
        return _merged([self._running(q) for q in queues])

    def usable_nodes(self, job: JobSpec) -> dict[int, bool]:
        """Whether one task of the job could ever fit on a node, by node kind (``NodeState.kind``),
        shared by the jobs of its shape number (``ShapeIndex``), filled in by the caller.

        Nodes of one kind answer alike for every job of one shape number:
        neither changes while the cluster runs, so nothing makes it stale.
        """
        return self._usable.setdefault(self.state.shapes.of(job), {})

    def protected(self, victim: Victim, preemptor: JobSpec, rule: str) -> str | None:
        """Why a victim may not be evicted for ``preemptor``: too young, or vetoed by a plugin."""
        if self.too_young(victim.job):
            return "ran less than the minimum run time"
        if self._veto is not None:
            vetoes = [v for v in self._veto(victim=victim, preemptor=preemptor, rule=rule) if v]
            if vetoes:
                return vetoes[0]
        return None


def _victim(entry: VictimEntry) -> Victim:
    """The victim of an entry."""
    victim: Victim = entry[2]
    return victim


def _merged(streams: list[Iterator[VictimEntry]]) -> Iterator[Victim]:
    """The victims of several streams of entries, each in victim order, merged in that order (ties: the
    earlier stream first), read only as far as they are needed."""
    # A generator function, never a generator expression: compiled (GPUD_COMPILE), a generator
    # expression may be read whole at once. heapq.merge, written in Python, is not used: this loop
    # is compiled with the core.
    heap: list[tuple] = []  # (key, tiebreak, stream, entry), plain tuples as VictimEntry is
    for first, stream in enumerate(streams):
        entry = next(stream, None)
        if entry is not None:
            heap.append((entry[0], entry[1], first, entry))
    heapq.heapify(heap)
    while heap:
        top = heap[0]
        number: int = top[2]
        yield _victim(top[3])
        following = next(streams[number], None)
        if following is None:
            heapq.heappop(heap)
        else:
            heapq.heapreplace(heap, (following[0], following[1], number, following))


def judged(victims: Iterable[Victim], keep: Callable[[Victim], bool]) -> Iterator[Victim]:
    """The victims ``keep`` accepts, each judged only when it is read: after the evictions made before."""
    for victim in victims:
        if keep(victim):
            yield victim


def tasks_to_evict(state: ClusterState, victim: Victim, node: str | None) -> list[int]:
    """The tasks a victim loses to free room on ``node`` (any node when None).

    An elastic job above its gang minimum loses only tasks above the
    minimum (the last started first), on that node; otherwise the whole job goes.
    """
    running = state.running_tasks(victim.job.id)
    placements = state.placements[victim.job.id]
    here = running if node is None else [t for t in running if (p := placements[t]) is not None and p.node == node]
    spare = len(running) - victim.job.gang_minimum
    if spare > 0 and here:
        return here[::-1][:spare] if node is not None else running[-1:]
    return running


def _without(victims: Iterable[Victim], refused: set[str]) -> Iterator[Victim]:
    """The victims whose jobs are not in ``refused``, in their order."""
    for victim in victims:
        if victim.job.id not in refused:
            yield victim


class Lazy:
    """A list filled from an iterator only as far as anyone has read it; may be read many times."""

    def __init__(self, source: Iterable[Victim]) -> None:
        self._source = iter(source)
        self._seen: list[Victim] = []

    def __iter__(self) -> Iterator[Victim]:
        yield from self._seen
        for item in self._source:
            self._seen.append(item)
            yield item


class ShareLimit:
    """How far a preemption may take its queue: never over its fair share, or further over it.

    The levels compared are the queue and its department; what each may
    hold, per resource, is the larger of its fair share and what it holds
    when the limit is made. ``explain`` says, for people, why the limit
    stopped the preemptor (a blocker, as data).
    """

    def __init__(self, queue: QueueState) -> None:
        # (level, GPUs, CPUs, memory it may hold): plain numbers, made at every preemption tried.
        self.levels = [_may_hold(queue)] if queue.parent is None else [_may_hold(queue), _may_hold(queue.parent)]
        # The first excess found: the level, what it held, the need, the resources over, its fair share then.
        self._refused: tuple[QueueState, tuple[float, float, float], Resources, list[str], Resources] | None = None
        self._over: Blocker | None = None
        self._explained: Blocker | None = None

    @property
    def stopped(self) -> bool:
        """True when the limit stopped the preemptor, told without making the blocker that says why (``explain``)."""
        return self._over is not None or self._refused is not None

    def explain(self) -> Blocker:
        """Why the limit stopped the preemptor (``stopped``), with the numbers as they were: made once, when
        first asked. A cycle's preemptions fail by the hundred, and few of their reasons are ever read."""
        if self._over is not None:
            return self._over
        if self._explained is None:
            assert self._refused is not None, "the limit stopped nothing"
            level, held, need, over, bound = self._refused
            self._explained = Blocker(PREEMPT_SHARE, level.pool, level.kind, level.name, need=need,
                                      held=Resources(held[0], held[1], held[2]), bound=bound, over=tuple(over))
        return self._explained

    def must_free(self, need: Resources) -> tuple[float, float, float]:
        """What evictions must free (GPUs, CPUs, memory) for the queue to take ``need`` more and stay within."""
        gpu = cpu = mem = 0.0
        for level, allowed_gpu, allowed_cpu, allowed_mem in self.levels:
            over_gpu = level.alloc_gpu + need.gpu - allowed_gpu
            over_cpu = level.alloc_cpu + need.cpu - allowed_cpu
            over_mem = level.alloc_mem + need.memory - allowed_mem
            if over_gpu > gpu:
                gpu = over_gpu
            if over_cpu > cpu:
                cpu = over_cpu
            if over_mem > mem:
                mem = over_mem
            if self._refused is None and (over_gpu > EPS or over_cpu > EPS or over_mem > EPS):
                # The numbers of the first excess found; the blocker is made only if someone asks why.
                over = [r for r, amount in zip(RESOURCES, (over_gpu, over_cpu, over_mem)) if amount > EPS]
                self._refused = (level, (level.alloc_gpu, level.alloc_cpu, level.alloc_mem), need, over,
                                 level.fair_share)
        return gpu, cpu, mem

    def refuse(self) -> bool:
        """Record, when a level holds more than it may, that this stopped the preemptor; True if so."""
        self._over = self.over()
        return self._over is not None

    def holds(self) -> bool:
        """True when no level holds more than it may."""
        return self.over() is None

    def admits(self, gpu: float, cpu: float, mem: float) -> bool:
        """True when every level would still hold no more than it may after taking this much more."""
        for level, allowed_gpu, allowed_cpu, allowed_mem in self.levels:
            if (level.alloc_gpu + gpu > allowed_gpu + EPS or level.alloc_cpu + cpu > allowed_cpu + EPS
                    or level.alloc_mem + mem > allowed_mem + EPS):
                return False
        return True

    def over(self) -> Blocker | None:
        """Which level holds more than it may, in which resource, with the numbers; None when none does."""
        for level, allowed_gpu, allowed_cpu, allowed_mem in self.levels:
            if (level.alloc_gpu <= allowed_gpu + EPS and level.alloc_cpu <= allowed_cpu + EPS
                    and level.alloc_mem <= allowed_mem + EPS):
                continue  # the common case, told without building the blocker
            held = level.allocated
            resource = next((r for r, allowed in zip(RESOURCES, (allowed_gpu, allowed_cpu, allowed_mem))
                             if held.get(r) > allowed + EPS), None)
            if resource is not None:
                return Blocker(PREEMPT_OVER, level.pool, level.kind, level.name, resource=resource, held=held,
                               bound=level.fair_share)
        return None


def _may_hold(level: QueueState) -> tuple[QueueState, float, float, float]:
    """(level, GPUs, CPUs, memory): the larger of its fair share and what it holds now, in each resource."""
    share = level.fair_share
    return (level, share.gpu if share.gpu > level.alloc_gpu else level.alloc_gpu,
            share.cpu if share.cpu > level.alloc_cpu else level.alloc_cpu,
            share.memory if share.memory > level.alloc_mem else level.alloc_mem)



def _always() -> bool:
    return True


def make_room(session: Session, job: JobSpec, candidates: Iterable[Victim],
              rule: str, eligible: Eligibility, lists: VictimLists,
              ready: Callable[[], bool] = _always, limit: ShareLimit | None = None,
              held: Callable[[], VictimsByNode] | None = None) -> bool:
    """Evict victims so ``job`` fits, then keep every victim that can stay; all or nothing.

    Victims are taken in victim order. When the job's queue must first give
    resources back (``ready`` false, e.g. a non-preemptible job over quota),
    victims go in that order until it is ready. Then, for each task, the node
    whose needed victims come earliest in the order is cleared. Before each
    eviction ``eligible`` is asked again (the state changes as victims go)
    and returns the reason recorded with the eviction, or None to pass the
    victim over. Once the job is placed, evicted tasks are put back on their
    very GPUs where those are still free (they did not move), else placed
    elsewhere (moved); the rest are stopped. With a ``limit``, each task
    whose queue it would take over the limit goes to a node where the
    victims free at least the excess, victims come back only while the
    queue stays within it, and the queue must end within it; ``held`` then
    gives at least what the candidates hold by node, so nodes where they
    cannot free the excess are passed over, and, where it was made from the
    candidates themselves, which of them sit on each node, so only those on
    the other nodes are searched. If the job does not fit, nothing changes.
    """
    return _RoomMaking(session, job, rule, eligible, lists, limit).run(candidates, ready, held)


class _RoomMaking:
    """One call of ``make_room``: its statement, the tasks it evicted and the victims the rule refused."""

    def __init__(self, session: Session, job: JobSpec, rule: str, eligible: Eligibility, lists: VictimLists,
                 limit: ShareLimit | None) -> None:
        self.state = session.state
        self.placer = session.placer
        self.planner = session.planner
        self.job = job
        self.rule = rule
        self.eligible = eligible
        self.lists = lists
        self.limit = limit
        self.stmt = session.statement()
        self.evicted: list[tuple[JobSpec, int, TaskPlacement]] = []
        # Victims the rule refused once: as victims go and the job's tasks come, no rule grows laxer.
        self.refused: set[str] = set()
        self.ordered: Iterable[Victim] = ()

    def run(self, candidates: Iterable[Victim], ready: Callable[[], bool],
            held: Callable[[], VictimsByNode] | None) -> bool:
        """Make room for the job's tasks (its minimum, at least one) and settle the victims; True when done."""
        state, job, lists, limit = self.state, self.job, self.lists, self.limit
        if job.id in state.touched or any(state.placements[job.id]):
            # Placed or evicted earlier in the cycle, or running and growing: it may be among the victims.
            lists.gained(state.queue_of(job))
        # Summed before the first eviction: sums made after it could be smaller than what a rollback gives back.
        holdings = held() if held is not None and limit is not None else None
        pending, minimum = needed_tasks(state, job)
        self.ordered = self._unprotected(candidates)
        if not self._evict_until(ready):
            return self._give_up()
        task_need = state.task_need(job)
        for task in pending[:max(minimum, 1)]:
            placement = self._place_task(task_need, holdings)
            if placement is None:
                return self._give_up()
            self.stmt.bind(job, task, placement)
        self._settle_victims()
        if limit is not None and limit.refuse():
            return self._give_up()
        if not self.planner.keeps():  # it would delay a reservation (gpud.core.reservations)
            return self._give_up()
        return True

    def _give_up(self) -> bool:
        """Undo every change of this call; False."""
        self.stmt.rollback()
        return False

    def _unprotected(self, candidates: Iterable[Victim]) -> Iterable[Victim]:
        """The candidates no rule protects, as a list that may be read many times."""
        if self.lists.vetoes:
            return Lazy(judged(candidates, self._may_evict))
        # Read several times: an iterator is kept as far as it was read.
        return candidates if isinstance(candidates, list) else Lazy(candidates)

    def _may_evict(self, victim: Victim) -> bool:
        """Whether no rule protects the victim; a victim whose job stopped is not asked about (it holds nothing)."""
        return any(self.state.placements[victim.job.id]) and self.lists.protected(victim, self.job, self.rule) is None

    def _evict(self, victim: Victim, node: str | None) -> bool:
        """Evict the victim's tasks on ``node`` (``tasks_to_evict``) if the rule lets it go; True if it did."""
        reason = self.eligible(victim)
        if reason is None:
            self.refused.add(victim.job.id)
            return False
        job, stmt = self.job, self.stmt
        for task in tasks_to_evict(self.state, victim, node):
            self.evicted.append((victim.job, task, stmt.evict(victim.job, task, self.rule, reason, job.id)))
        return True

    def _evict_until(self, ready: Callable[[], bool]) -> bool:
        """Evict victims in order until ``ready`` says the job's queue may take it; False if they run out first."""
        running_tasks = self.state.running_tasks
        for victim in self.ordered:
            if ready():
                return True
            if running_tasks(victim.job.id):
                self._evict(victim, None)
        return ready()  # the victims ran out: asked once more after the last

    def _place_task(self, task_need: Resources,
                    holdings: VictimsByNode | None) -> TaskPlacement | None:
        """A placement for one task: free room as it is, else on the node cleared by the victims
        ``cheapest_room`` chooses; None when no node can be cleared."""
        limit = self.limit
        must = limit.must_free(task_need) if limit is not None else None
        if must is not None and max(must) <= EPS:
            must = None
        least = least_must(self.state, self.job, must) if must is not None else None
        placement = self.placer.find(self.job) if least is None or max(least) <= EPS else None
        if placement is not None and must is not None and must_gpu_on(must[0], task_need.gpu,
                                                                       placement.gpu_share) > EPS:
            placement = None  # a memory slice on a GPU too small to go without evictions
        while placement is None:
            # The node whose victims come first; were one of them refused when its turn came (its
            # queue no longer over its level), the node is chosen again without it.
            refused = self.refused
            ordered = self._searched(must, holdings)
            choice = ordered if not refused else _without(ordered, refused)
            room = cheapest_room(self.state, self.placer, self.job, choice, self.lists.usable_nodes(self.job),
                                 must, holdings, self.lists.weighs_lost_work)
            if room is None:
                return None
            before = len(refused)
            placement = self._clear(room)
            if placement is None and len(refused) == before:
                return None
        return placement

    def _searched(self, must: tuple[float, float, float] | None, holdings: VictimsByNode | None) -> Iterable[Victim]:
        """The victims the search for a node walks: with ``must``, where ``holdings`` was made from the very
        list of victims (no plugin may veto one), only those sitting on a node whose victims hold ``must``
        (the least of it on any node, ``least_must``).

        The search passes over every other node (``cheapest_room``), so a
        victim with no task on such a node changes nothing it finds.
        """
        if must is None or holdings is None or self.ordered is not holdings.victims:
            return self.ordered
        gpu, cpu, mem = enough_held(least_must(self.state, self.job, must))
        return holdings.sitting_on(holdings.nodes_holding(gpu, cpu, mem))

    def _clear(self, room: NodeRoom) -> TaskPlacement | None:
        """Evict the room's victims from its node, then place one task of the job there, or None."""
        name = room.node.name
        for victim in room.victims:
            self._evict(victim, name)
        placement = self.placer.fit_on(self.job, room.node)
        if placement is None:
            # An elastic victim gave only its tasks above its minimum; where that is not enough,
            # the rest of it goes too (below its minimum, the whole job).
            placements = self.state.placements
            for victim in room.victims:
                if any(p is not None and p.node == name for p in placements[victim.job.id]):
                    self._evict(victim, name)
            placement = self.placer.fit_on(self.job, room.node)
        return placement

    def _settle_victims(self) -> None:
        """Put each evicted job's tasks back on their very GPUs where they are still free, else elsewhere
        (moved); a job left below its gang minimum, or taking the queue over the limit, is stopped whole."""
        state, placer, stmt, limit = self.state, self.placer, self.stmt, self.limit
        by_job: dict[str, tuple[JobSpec, list[tuple[int, TaskPlacement]]]] = {}
        for vjob, task, placement in self.evicted:
            by_job.setdefault(vjob.id, (vjob, []))[1].append((task, placement))
        for vjob, tasks in by_job.values():
            request = vjob.request
            if limit is not None and not limit.admits(request.gpus if request.gpu_memory_gib is None else 0.0,
                                                      request.cpus, request.memory_gib):
                continue  # even one task back would take the queue over its limit: it would be undone
            mark = stmt.checkpoint()
            lost = [task for task, placement in tasks if not placer.restore(stmt, vjob, task, placement)]
            if lost:
                self.lists.gained(state.queue_of(vjob))
                running = len(state.running_tasks(vjob.id))
                placed = stmt.checkpoint()
                placer.place(stmt, vjob, lost, max(0, vjob.gang_minimum - running))
                if self._moved_past_limit(vjob, [p for t, p in tasks if t in lost], lost, placed):
                    stmt.rollback(mark)
                    continue
            running = len(state.running_tasks(vjob.id))
            if 0 < running < vjob.gang_minimum or (limit is not None and not limit.holds()):
                stmt.rollback(mark)

    def _moved_past_limit(self, vjob: JobSpec, before: list[TaskPlacement], tasks: list[int], placed: int) -> bool:
        """Whether the victim's tasks, moved, hold more GPUs than ``before`` (a memory slice on smaller GPUs)
        and so take its user or project past a limit that they were within, or further past it."""
        book, placements = self.state.book, self.state.placements[vjob.id]
        held = sum(p.gpu_share * len(p.gpu_index) for p in before)
        now = [placements[task] for task in tasks]
        gpus = sum(p.gpu_share * len(p.gpu_index) for p in now if p is not None)
        if book is None or gpus <= held + EPS:
            return False
        self.stmt.rollback(placed)  # the book as before the move, to ask it about the move's GPUs
        past = book.refusal(vjob, gpus) is not None
        if not past:
            for task, placement in zip(tasks, now):
                if placement is not None:
                    self.stmt.bind(vjob, task, placement)
        return past
