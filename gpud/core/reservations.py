"""Reservations and backfill: when jobs that find no room will start, and the room kept for them.

Allocation asks this module about each pool it works in. The first jobs of
a pool, in queue order, that find no room for lack of free resources get a
*reservation*: the earliest time the room they need is free, worked out
from the end of every running job's time limit (its start plus its limit),
on a time profile of the pool's nodes. The room a reservation needs and
that is free now is *held*: kept out of reach, as a task no job owns
(``ClusterState.hold``), so a later job may use it only if it ends before
the reservation starts (``borrow``). The jobs after them get an estimate
only. Everything is worked out anew each cycle and dropped when allocation
ends: nothing is kept that a restart could lose.
"""

from __future__ import annotations

import bisect
import dataclasses
import math
from typing import Callable, Final, Iterator

from gpud.core.nodes import NodeIndex, NodeState
from gpud.core.shapes import FailedShapes
from gpud.core.state import ClusterState, Statement, moved
from gpud.model import EPS, JobSpec, Reservation, TaskPlacement, TaskRequest
from gpud.policy import Reservations

HOLD: Final = "\x00reserved"  # the job id of the tasks that hold room: no job id can be empty-led like it
RUNNING: Final = 0
HOLDING: Final = 1
ESTIMATE: Final = 2
FOREVER: Final = float("inf")
MAX_TIMES: Final = 512  # start times tried for one job; a job that fits at none of them gets no plan
LEAST_IDLE_TRIES: Final = 32  # latest nodes tried by ``_least_idle``, the earliest to free first
LEAST_IDLE_NODES: Final = 64  # nodes ``_least_idle`` chooses among, at most
LEAST_IDLE_TIMES: Final = 8  # times in a resolution step that ``_least_idle`` works out a choice at, at most


def on_grid(t: float, step: float) -> float:
    """The first multiple of ``step`` seconds (Unix time) at or after t; t itself when ``step`` is 0."""
    if step <= 0:
        return t
    found = math.ceil(t / step) * step
    return found if found >= t else t


def end_of(job: JobSpec, now: float) -> float:
    """When the job's time limit stops it (``FOREVER`` without one); a job past its limit ends now."""
    limit = job.time_limit
    if limit is None:
        return FOREVER
    started = job.started if job.started is not None else now
    end = started + limit
    return end if end > now else now


def predicted_end(job: JobSpec, now: float) -> float:
    """When the job is expected to end: its predicted run time, never past its limit."""
    end = end_of(job, now)
    if job.predicted_runtime is None:
        return end
    started = job.started if job.started is not None else now
    guess = started + job.predicted_runtime
    guess = guess if guess > now else now
    return guess if guess < end else end


class Occupant:
    """What one job holds on one node from ``start`` to ``end`` (``pstart``/``pend``: as predicted)."""

    __slots__ = ("gpus", "share", "cpu", "mem", "start", "end", "pstart", "pend", "kind", "job")

    def __init__(self, gpus: tuple[int, ...], share: float, cpu: float, mem: float, start: float, end: float,
                 pstart: float, pend: float, kind: int, job: str = "") -> None:
        self.gpus = gpus
        self.share = share
        self.cpu = cpu
        self.mem = mem
        self.start = start
        self.end = end
        self.pstart = pstart
        self.pend = pend
        self.kind = kind
        self.job = job


class NodeProfile:
    """One node's occupants over time: running tasks and the reservations planned on it; ``index``: its
    place in its pool's list of profiles."""

    __slots__ = ("node", "occupants", "index", "version", "_now_at", "_now_gpus", "_all_at", "_all_free",
                 "_all_most", "_all_whole")

    def __init__(self, node: NodeState, index: int = 0) -> None:
        self.node = node
        self.occupants: list[Occupant] = []
        self.index = index
        self.version = 0  # moves with every occupant added or taken out
        self._now_at = [-1, -1]  # by predicted (0, 1): the version the GPUs free now were worked out at
        self._now_gpus: list[list[float]] = [[], []]
        self._all_at = [-1, -1]  # the same for the room free now of every occupant (``free_at_now``)
        self._all_free: list[tuple[list[float], float, float]] = [([], 0.0, 0.0), ([], 0.0, 0.0)]
        self._all_most = [0.0, 0.0]  # the most free of one GPU, in that room
        self._all_whole = [0, 0]  # its wholly free GPUs

    def free_at_now(self, now: float, predicted: bool) -> tuple[list[float], float, float]:
        """``free_over`` the instant now, every occupant counted (kept until the occupants change): the
        room free over any time from now to a later one for a node with nothing ending or starting
        between the two."""
        which = 1 if predicted else 0
        if self._all_at[which] != self.version:
            free = self._all_free[which] = self.free_over(now, now + EPS, predicted, ESTIMATE)
            self._all_most[which] = max(free[0], default=0.0)
            self._all_whole[which] = sum(1 for g in free[0] if g >= 1.0 - EPS)
            self._all_at[which] = self.version
        return self._all_free[which]

    def may_fit_now(self, request: TaskRequest, predicted: bool) -> bool:
        """False when not one task of ``request`` fits in the room ``free_at_now`` found last: a quick
        answer for the many full nodes of a busy pool."""
        which = 1 if predicted else 0
        free = self._all_free[which]
        if free[1] < request.cpus - EPS or free[2] < request.memory_gib - EPS:
            return False
        if not request.uses_gpu:
            return True
        if request.is_shared:
            memory = self.node.gpu_memory_gib
            if request.gpu_memory_gib is not None and request.gpu_memory_gib > memory + EPS:
                return False
            return self._all_most[which] >= request.gpu_share_on(memory) - EPS
        return self._all_whole[which] >= request.whole_gpus

    def free_now(self, now: float, predicted: bool) -> list[float]:
        """The share of each GPU free now, counting running tasks only (kept until the occupants change)."""
        which = 1 if predicted else 0
        if self._now_at[which] != self.version:
            self._now_gpus[which] = self.free_over(now, now + EPS, predicted, RUNNING)[0]
            self._now_at[which] = self.version
        return self._now_gpus[which]

    def free_over(self, t0: float, t1: float, predicted: bool, most_kind: int) -> tuple[list[float], float, float]:
        """The share of each GPU, the CPUs and the memory free for the whole of [t0, t1) (the instant
        t0 when t1 is not after it), counting occupants of kind ``most_kind`` or below."""
        spec = self.node.spec
        gpus = [1.0] * spec.gpus
        for i in spec.out_of_service:
            gpus[i] = 0.0
        cpu, mem = spec.cpus, spec.memory_gib
        for o in self.occupants:
            if o.kind > most_kind:
                continue
            start, end = (o.pstart, o.pend) if predicted else (o.start, o.end)
            # [t0, t1) overlaps [start, end); an empty [t0, t1) (t1 == t0, as t0 + EPS is at a Unix
            # time's magnitude) stands for the instant t0.
            if (start < t1 and end > t0) if t1 > t0 else (start <= t0 < end):
                for i in o.gpus:
                    gpus[i] -= o.share
                cpu -= o.cpu
                mem -= o.mem
        return gpus, cpu, mem

    def holds(self, now: float) -> tuple[list[float], float, float]:
        """The room free now that the node's holding reservations need later: per GPU, CPUs, memory."""
        free_gpus, free_cpu, free_mem = self.free_over(now, now + EPS, False, RUNNING)
        least_gpus, least_cpu, least_mem = list(free_gpus), free_cpu, free_mem
        for o in self.occupants:
            if o.kind != HOLDING:
                continue
            at = o.start if o.start > now else now
            gpus, cpu, mem = self.free_over(at, at + EPS, False, HOLDING)
            least_gpus = [min(a, b) for a, b in zip(least_gpus, gpus)]
            least_cpu, least_mem = min(least_cpu, cpu), min(least_mem, mem)
        return ([max(0.0, f - least) for f, least in zip(free_gpus, least_gpus)],
                max(0.0, free_cpu - least_cpu), max(0.0, free_mem - least_mem))

    def overbooked(self, now: float) -> bool:
        """True when running tasks and holding reservations together need more than the node has at
        some moment (only a reservation's start can make it so)."""
        times = [now] + [o.start for o in self.occupants if o.kind == HOLDING and o.start > now]
        for t in times:
            gpus, cpu, mem = self.free_over(t, t + EPS, False, HOLDING)
            if cpu < -EPS or mem < -EPS or any(g < -EPS for g in gpus):
                return True
        return False


class Timeline:
    """The room of a list of node profiles over time, kept as occupants come and go: the room free now,
    summed, the changes to come in time order, the ends of what runs now by node, and the nodes with
    a start planned later (``predicted``: by predicted starts and ends)."""

    def __init__(self, nodes: list[NodeProfile], now: float, predicted: bool) -> None:
        self.now = now
        self.predicted = predicted
        self.gpu = self.cpu = self.mem = 0.0  # free now, summed
        self.events: list[tuple[float, float, float, float]] = []  # (time, GPUs, CPUs, memory) freed (<0: taken)
        # (end, node, key) of occupants that started by now; ``ended`` finds the occupant by its key
        self.ends: list[tuple[float, int, int]] = []
        self.ended: dict[int, Occupant] = {}
        self.later: dict[int, int] = {}  # node -> how many of its occupants start later
        for k, profile in enumerate(nodes):
            spec = profile.node.spec
            self.gpu += spec.usable_gpus
            self.cpu += spec.cpus
            self.mem += spec.memory_gib
            for o in profile.occupants:
                self._count(o, k, 1, False)
        self.events.sort()
        self.ends.sort()

    def _count(self, o: Occupant, k: int, sign: int, keep_order: bool) -> None:
        """Count the occupant on node ``k`` in (sign 1) or out (sign -1); ``keep_order``: into sorted lists."""
        now = self.now
        start, end = (o.pstart, o.pend) if self.predicted else (o.start, o.end)
        g = o.share * len(o.gpus)
        changes: list[tuple[float, float, float, float]] = []
        if start <= now:
            self.gpu -= sign * g
            self.cpu -= sign * o.cpu
            self.mem -= sign * o.mem
            if now < end < FOREVER:
                key = id(o)
                self._edit(self.ends, (end, k, key), sign, keep_order)
                if sign > 0:
                    self.ended[key] = o
                else:
                    del self.ended[key]
        else:
            changes.append((start, -g, -o.cpu, -o.mem))
            self.later[k] = self.later.get(k, 0) + sign
            if not self.later[k]:
                del self.later[k]
        if end < FOREVER:
            changes.append((end, g, o.cpu, o.mem))
        for change in changes:
            self._edit(self.events, change, sign, keep_order)

    @staticmethod
    def _edit(items: list, item: tuple, sign: int, keep_order: bool) -> None:
        if sign < 0:
            del items[bisect.bisect_left(items, item)]
        elif keep_order:
            bisect.insort(items, item)
        else:
            items.append(item)

    def add(self, o: Occupant, k: int) -> None:
        """Count a new occupant of node ``k``."""
        self._count(o, k, 1, True)

    def remove(self, o: Occupant, k: int) -> None:
        """Count out an occupant of node ``k`` counted before."""
        self._count(o, k, -1, True)

    def possible_times(self, gpu: float, cpu: float, mem: float) -> Iterator[float]:
        """The times, in order, at which something ends (and now) when the nodes have, summed, at least
        the GPUs, CPUs and memory asked free: a job cannot start at any other."""
        free_gpu, free_cpu, free_mem = self.gpu, self.cpu, self.mem
        events = self.events
        i, n = 0, len(events)
        at = self.now
        while True:
            while i < n and events[i][0] <= at:
                _, g, c, m = events[i]
                free_gpu, free_cpu, free_mem = free_gpu + g, free_cpu + c, free_mem + m
                i += 1
            if free_gpu >= gpu - EPS and free_cpu >= cpu - EPS and free_mem >= mem - EPS:
                yield at
            if i >= n:
                return
            at = events[i][0]


def tasks_fitting(request: TaskRequest, node: NodeState, gpus: list[float], cpu: float, mem: float,
                  busy_first: list[float] | None = None) -> tuple[int, list[int]]:
    """How many tasks of ``request`` fit in the free room given, and the GPUs they take (each task's
    in turn, one index per task for a shared request); GPUs least free in ``busy_first`` (free now)
    are taken first, so a reservation holds as little of what is free now as it can."""
    by_host = FOREVER
    if request.cpus > EPS:
        by_host = (cpu + EPS) // request.cpus
    if request.memory_gib > EPS:
        by_host = min(by_host, (mem + EPS) // request.memory_gib)
    if not request.uses_gpu:
        return (int(by_host) if by_host < FOREVER else 1 << 20), []
    if request.is_shared:
        if request.gpu_memory_gib is not None and request.gpu_memory_gib > node.gpu_memory_gib + EPS:
            return 0, []
        share = request.gpu_share_on(node.gpu_memory_gib)
        chosen: list[int] = []
        for i, free in enumerate(gpus):
            while free >= share - EPS and len(chosen) < by_host:
                chosen.append(i)
                free -= share
        return len(chosen), chosen
    count = request.whole_gpus
    whole = [i for i, free in enumerate(gpus) if free >= 1.0 - EPS]
    if busy_first is not None:
        whole.sort(key=lambda i: busy_first[i])
    fit = min(len(whole) // count, by_host) if count else by_host
    fit_n = int(fit)
    return fit_n, whole[:fit_n * count]


def count_fitting(request: TaskRequest, node: NodeState, gpus: list[float], cpu: float, mem: float) -> int:
    """How many tasks of ``request`` fit in the free room given: ``tasks_fitting``'s count, without
    choosing GPUs."""
    by_host = FOREVER
    if request.cpus > EPS:
        by_host = (cpu + EPS) // request.cpus
    if request.memory_gib > EPS:
        by_host = min(by_host, (mem + EPS) // request.memory_gib)
    if not request.uses_gpu:
        return int(by_host) if by_host < FOREVER else 1 << 20
    if request.is_shared:
        if request.gpu_memory_gib is not None and request.gpu_memory_gib > node.gpu_memory_gib + EPS:
            return 0
        share = request.gpu_share_on(node.gpu_memory_gib)
        found = 0
        for free in gpus:
            while free >= share - EPS and found < by_host:
                found += 1
                free -= share
        return found
    count = request.whole_gpus
    whole = 0
    for free in gpus:
        if free >= 1.0 - EPS:
            whole += 1
    return int(min(whole // count, by_host) if count else by_host)


class PoolPlan:
    """One pool's time profile during allocation, the reservations made in it and the room they hold."""

    def __init__(self, state: ClusterState, index: NodeIndex, settings: Reservations) -> None:
        self.state = state
        self.settings = settings
        self.now = state.now
        self.holding = 0
        self.estimates = 0
        self.latest_hold = -FOREVER  # the latest start of a holding reservation
        self.held: dict[NodeState, list[tuple[tuple[str, int], TaskRequest]]] = {}
        self.held_nodes: list[NodeState] = []  # every node a holding reservation is planned on
        # Jobs that could not borrow held room, by their end as their own dimension (a later end is
        # harder): one as large that ends as late fails too, while allocation only takes room.
        self.borrow_failed = FailedShapes(state)
        self.profiles: dict[str, NodeProfile] = {}
        self.nodes: list[NodeProfile] = []
        for node in index.nodes:
            profile = self.profiles[node.name] = NodeProfile(node, len(self.nodes))
            profile.occupants = self._running_on(node)
            self.nodes.append(profile)
        # Whether some running job is expected to end before its limit: else estimates are the starts.
        self.predicts = any(o.pend < o.end for p in self.nodes for o in p.occupants)
        # The pool's room over time by limits, and as predicted once asked, kept as occupants come and go.
        self.timelines: list[Timeline] = [Timeline(self.nodes, self.now, False)]
        # Jobs that ask for no more CPUs and memory than every node has, and select no nodes, may run on
        # every node: they read the pool's timelines.
        self.least_cpu = min(p.node.spec.cpus for p in self.nodes)
        self.least_mem = min(p.node.spec.memory_gib for p in self.nodes)
        self.kept: dict[NodeState, int] = {}  # held nodes found to keep their reservations, at their version
        self._frees: dict[int, tuple[int, list[float]]] = {}  # ``_predicted_free`` by node, at its version

    def _timeline(self, predicted: bool) -> Timeline:
        """The pool's timeline, by limits or as predicted."""
        if not predicted:
            return self.timelines[0]
        if len(self.timelines) == 1:
            self.timelines.append(Timeline(self.nodes, self.now, True))
        return self.timelines[1]

    def _occupy(self, profile: NodeProfile, o: Occupant) -> None:
        """Add an occupant to a node's profile, and to the pool's timelines."""
        profile.occupants.append(o)
        profile.version += 1
        for timeline in self.timelines:
            timeline.add(o, profile.index)

    def _truncate(self, profile: NodeProfile, size: int) -> None:
        """Take out the node's occupants after its first ``size``."""
        for o in profile.occupants[size:]:
            for timeline in self.timelines:
                timeline.remove(o, profile.index)
        del profile.occupants[size:]
        profile.version += 1

    def _running_on(self, node: NodeState) -> list[Occupant]:
        """The tasks on the node as occupants until their jobs' limits end (room held is none of them); a job
        moved this cycle starts again now, and so does its limit."""
        state, now = self.state, self.now
        jobs, touched, placements = state.jobs, state.touched, state.placements
        found = []
        for (job_id, _), placement in node.tasks.items():
            job = jobs.get(job_id)
            if job is None:
                continue
            if job_id in touched and job.started is not None and moved(job, placements[job_id]):
                job = dataclasses.replace(job, started=now)
            request = job.request
            found.append(Occupant(placement.gpu_index, placement.gpu_share, request.cpus, request.memory_gib,
                                  -FOREVER, end_of(job, now), -FOREVER, predicted_end(job, now), RUNNING, job_id))
        return found

    def keeps(self) -> bool:
        """True when the tasks placed now still leave every holding reservation its room at its start
        (the profile's running tasks are read anew from the nodes; a reserved job that runs now needs
        its reservation no more)."""
        placements, now = self.state.placements, self.now
        for node in self.held_nodes:
            # A node unchanged since it was found to keep them still does: reserved jobs that started
            # since need less of it, not more.
            if self.kept.get(node, -1) == node.version:
                continue
            profile = self.profiles[node.name]
            planned = [o for o in profile.occupants if o.kind != RUNNING]
            check = NodeProfile(node)
            check.occupants = self._running_on(node) + [
                o for o in planned if o.kind == HOLDING and None in placements.get(o.job, (None,))]
            if check.overbooked(now):
                return False
            self.kept[node] = node.version
        return True

    # --- planning a job ---------------------------------------------------------------------------

    def plan(self, job: JobSpec, tasks: int, entitled: bool) -> Reservation | None:
        """Plan the job's start (``tasks``: how many must start together): a holding reservation while
        the pool has fewer than its ``jobs`` and the job is ``entitled`` to the room, else an estimate
        while it has fewer than ``estimate_jobs``; None when neither (or it never fits)."""
        settings, now = self.settings, self.now
        hold = entitled and self.holding < settings.jobs
        if not hold and self.estimates >= settings.estimate_jobs:
            return None
        limit = job.time_limit if job.time_limit is not None else FOREVER
        found = self._earliest(job, tasks, limit, False, settings.resolution_s if hold else -1.0)
        if found is None:
            return None
        start, chosen = found
        # A holding reservation promises the end of its resolution step: its nodes are chosen among those
        # that fit by then (``_earliest``), and a later cycle's choice fits by then too.
        promised = on_grid(start, settings.resolution_s) if hold else start
        if hold and start - now > settings.window_s:
            hold = False
            if self.estimates >= settings.estimate_jobs:
                return None
        runtime = limit if job.predicted_runtime is None else min(job.predicted_runtime, limit)
        predicted = self._earliest(job, tasks, runtime, True) if self.predicts or runtime < limit else None
        estimate = start if predicted is None or predicted[0] > start else predicted[0]
        kind = HOLDING if hold else ESTIMATE
        request = job.request
        for node, gpus, count in chosen:
            share = request.gpu_share_on(node.node.gpu_memory_gib) if request.is_shared else 1.0
            # A shared task takes one GPU each: as many occupants as GPUs, each with its tasks' share.
            groups: list[tuple[tuple[int, ...], float]] = [(tuple(gpus), share)]
            if request.is_shared:
                groups = [((i,), share * gpus.count(i)) for i in sorted(set(gpus))] or [((), 0.0)]
            for index, (indices, amount) in enumerate(groups):
                host = count if index == 0 else 0
                self._occupy(node, Occupant(indices, amount, request.cpus * host, request.memory_gib * host,
                                            start, start + limit, estimate, estimate + runtime, kind, job.id))
        if estimate < start:
            self.predicts = True
        if hold:
            self.holding += 1
            self.latest_hold = max(self.latest_hold, start)
            for node, _, _ in chosen:
                self._hold(node)
                if node.node not in self.held_nodes:
                    self.held_nodes.append(node.node)
        else:
            self.estimates += 1
        return Reservation(job.id, self.state.pool_of(job), promised if hold else start,
                           tuple(sorted(p.node.name for p, _, _ in chosen)), hold, estimate)

    def _earliest(self, job: JobSpec, tasks: int, runtime: float, predicted: bool,
                  slack: float = -1.0) -> tuple[float, list[tuple[NodeProfile, list[int], int]]] | None:
        """The earliest time ``tasks`` tasks of the job fit together for ``runtime`` seconds, and where.
        With a ``slack`` of 0 or more (a holding reservation's resolution), the times up to the end of
        the earliest's resolution step (``on_grid``) are tried too, and the time and nodes expected to
        leave the least GPU time idle while they wait for the job win (``_least_idle``); the earliest
        among equals."""
        now = self.now
        request, selector = job.request, job.node_selector
        # Most jobs may run on every node of the pool: its timeline, kept, serves. Others get their own.
        if not selector and request.cpus <= self.least_cpu + EPS and request.memory_gib <= self.least_mem + EPS:
            nodes = self.nodes
            timeline = self._timeline(predicted)
        else:
            nodes = [p for p in self.nodes
                     if (not selector or p.node.matches(selector)) and request.cpus <= p.node.spec.cpus + EPS
                     and request.memory_gib <= p.node.spec.memory_gib + EPS]
            if not nodes:
                return None
            timeline = Timeline(nodes, now, predicted)
        need_gpu = tasks * (request.gpu_share_on(nodes[0].node.gpu_memory_gib) if request.is_shared
                            else float(request.whole_gpus))
        # A node whose occupants all started by now only gains room as they end: its room at t is its
        # room now plus what ended on it by t, added as t passes each end, and its fit changes only then.
        # One with a planned start later (a reservation) is worked out anew at its changes.
        ends, ended, later = timeline.ends, timeline.ended, timeline.later
        # A node with a start planned later (a reservation) changes too as the job's span [t, t + runtime)
        # comes to cover such a start, and as t passes its end: at those times only.
        later_ends, comings = self._later_changes(nodes, timeline, runtime, predicted)
        counts = [0] * len(nodes)
        chosen_later: dict[int, list[int]] = {}  # a later node's GPUs, from when it was last worked out
        rooms: dict[int, tuple[list[float], float, float]] = {}  # a node's room at t, once something ended on it
        total = 0
        stale: set[int] = set(later)
        at = at_later = at_coming = 0
        near: list[tuple[float, int]] = []  # starts the span is about to cover, or just did
        tried = 0
        slack = slack if request.uses_gpu else -1.0
        # (idle, expected free, t, where) of each time tried; the soonest any choice is expected free
        found: list[tuple[float, float, float, list[tuple[NodeProfile, list[int], int]]]] = []
        soonest = FOREVER
        until = FOREVER  # the last time tried: the end of the first fit's resolution step
        tried_total = 0  # the tasks that fit at the last time a choice was worked out
        for t in timeline.possible_times(need_gpu, tasks * request.cpus, tasks * request.memory_gib):
            tried += 1
            if tried > MAX_TIMES or t > until:
                break
            while at < len(ends) and ends[at][0] <= t:
                _, k, key = ends[at]
                at += 1
                stale.add(k)
                if k in later:
                    continue
                room = rooms.get(k)
                if room is None:
                    gpus, cpu, mem = nodes[k].free_at_now(now, predicted)
                    room = (list(gpus), cpu, mem)
                o = ended[key]
                free = room[0]
                for i in o.gpus:
                    free[i] += o.share
                rooms[k] = (free, room[1] + o.cpu, room[2] + o.mem)
            while at_later < len(later_ends) and later_ends[at_later][0] <= t:
                stale.add(later_ends[at_later][1])
                at_later += 1
            # Whether t + runtime is past a start rounds either way near it: a node is worked out at every
            # time within a second of it, and at the first after.
            while at_coming < len(comings) and comings[at_coming][0] - 1.0 <= t:
                near.append(comings[at_coming])
                at_coming += 1
            if near:
                for _, k in near:
                    stale.add(k)
                near = [c for c in near if c[0] + 1.0 >= t]
            if tried == 1:  # every node's fit, first: as now where nothing ends or starts before t
                for k, profile in enumerate(nodes):
                    if k not in stale:
                        gpus, cpu, mem = profile.free_at_now(now, predicted)
                        if profile.may_fit_now(request, predicted):
                            count = count_fitting(request, profile.node, gpus, cpu, mem)
                            if count > 0:
                                counts[k] = count
                                total += count
            for k in stale:
                profile = nodes[k]
                if k in later:
                    gpus, cpu, mem = profile.free_over(t, t + runtime if runtime > 0 else t + EPS, predicted,
                                                       ESTIMATE)
                    count, chosen = tasks_fitting(request, profile.node, gpus, cpu, mem,
                                                  profile.free_now(now, predicted))
                    chosen_later[k] = chosen
                else:
                    gpus, cpu, mem = rooms[k]
                    count = count_fitting(request, profile.node, gpus, cpu, mem)
                count = count if count > 0 else 0  # room overbooked by a planned start counts as none
                total += count - counts[k]
                counts[k] = count
            stale = set()
            if total < tasks:
                continue
            if slack < 0.0:
                return t, self._chosen(request, tasks, nodes, counts, chosen_later, t, runtime, predicted)
            # Later in the step, a time is worth a choice only where more room fits than at the last tried.
            if found and (total <= tried_total or len(found) >= LEAST_IDLE_TIMES):
                continue
            tried_total = total
            idle, latest, first, placed = self._least_idle(request, tasks, nodes, counts, chosen_later, t, runtime,
                                                           slack)
            if not found:
                until = on_grid(t, slack)
            found.append((idle, latest, t, placed))
            soonest = min(soonest, first)
        # The least idle of the choices expected free within the slack of the soonest; a GPU-second less
        # idle is worth a later start, less is not.
        best: tuple[float, float, float, list[tuple[NodeProfile, list[int], int]]] | None = None
        for choice in found:
            if choice[1] <= soonest + slack and (best is None or choice[0] < best[0] - 1.0):
                best = choice
        return None if best is None else (best[2], best[3])

    def _chosen(self, request: TaskRequest, tasks: int, nodes: list[NodeProfile], counts: list[int],
                chosen_later: dict[int, list[int]], t: float, runtime: float,
                predicted: bool) -> list[tuple[NodeProfile, list[int], int]]:
        """Where ``tasks`` tasks go at t, given each node's count of tasks fitting: the nodes that fit the
        most first (by name among equals), and the GPUs each takes (GPUs least free now first)."""
        now = self.now
        fits = sorted((-count, nodes[k].node.name, k) for k, count in enumerate(counts) if count > 0)
        per_task = request.whole_gpus if not request.is_shared else 1
        placed: list[tuple[NodeProfile, list[int], int]] = []
        left = tasks
        for negative, _, k in fits:
            profile = nodes[k]
            take = min(-negative, left)
            chosen: list[int] = []
            if request.uses_gpu:
                if k in chosen_later:
                    chosen = chosen_later[k]
                else:  # all its occupants started by now: its room over the span is its room at t
                    gpus, cpu, mem = profile.free_over(t, t + runtime if runtime > 0 else t + EPS, predicted,
                                                       ESTIMATE)
                    chosen = tasks_fitting(request, profile.node, gpus, cpu, mem, profile.free_now(now, predicted))[1]
            placed.append((profile, chosen[:take * per_task], take))
            left -= take
            if not left:
                break
        return placed

    def _least_idle(self, request: TaskRequest, tasks: int, nodes: list[NodeProfile], counts: list[int],
                    chosen_later: dict[int, list[int]], t: float, runtime: float,
                    slack: float) -> tuple[float, float, float, list[tuple[NodeProfile, list[int], int]]]:
        """Where ``tasks`` tasks go at t so that the GPUs they take, freed at their running jobs' predicted
        ends, wait idle the least for the last of them, among the choices expected free within ``slack``
        seconds of the soonest: the idle expected (GPU-seconds), when the choice is expected free, the
        soonest any is, and the choice (as ``_chosen``). Nodes that free together win over a node free
        now that would wait for others to drain."""
        now = self.now
        per_task = request.whole_gpus if not request.is_shared else 1
        # (latest predicted free, minus the mean, name, node, its GPUs, tasks it takes, their frees)
        options: list[tuple[float, float, str, int, list[int], int, list[float]]] = []
        fitting = [k for k, count in enumerate(counts) if count > 0]
        if len(fitting) > LEAST_IDLE_NODES:  # a large pool: the nodes ``_chosen`` would take first
            fitting = sorted(fitting, key=lambda k: (-counts[k], nodes[k].node.name))[:LEAST_IDLE_NODES]
        for k in fitting:
            count = counts[k]
            profile = nodes[k]
            take = count if count < tasks else tasks
            if k in chosen_later:
                gpus = chosen_later[k]
            else:
                free, cpu, mem = profile.free_over(t, t + runtime if runtime > 0 else t + EPS, False, ESTIMATE)
                gpus = tasks_fitting(request, profile.node, free, cpu, mem, profile.free_now(now, False))[1]
            gpus = gpus[:take * per_task]
            frees = self._predicted_free(profile)
            times = [frees[i] for i in gpus]
            mean = sum(times) / len(times) if times else now
            options.append((max(times, default=now), -mean, profile.node.name, k, gpus, take, times))
        options.sort()
        best_idle, best_latest, soonest = FOREVER, FOREVER, FOREVER
        best: list[tuple[tuple[float, float, str, int, list[int], int, list[float]], int]] = []
        covered, tried = 0, 0
        for j, option in enumerate(options):
            covered += option[5]
            if covered < tasks:
                continue
            if soonest == FOREVER:  # the nodes that free first: no choice is expected free sooner
                soonest = option[0]
            tried += 1
            if tried > LEAST_IDLE_TRIES or option[0] > soonest + slack:
                break
            # The last of the first j + 1 nodes to free sets the start: of those, the ones freeing nearest it.
            taken: list[tuple[tuple[float, float, str, int, list[int], int, list[float]], int]] = []
            left, latest = tasks, now
            for o in sorted(options[:j + 1], key=lambda o: (o[1], o[2])):
                take = o[5] if o[5] < left else left
                taken.append((o, take))
                latest = max(latest, max(o[6][:take * per_task], default=now))
                left -= take
                if not left:
                    break
            idle = sum(latest - f for o, take in taken for f in o[6][:take * per_task])
            if idle < best_idle - EPS:
                best_idle, best_latest, best = idle, latest, taken
        placed = [(nodes[o[3]], o[4][:take * per_task], take) for o, take in best]
        share = request.gpu_share_on(nodes[0].node.gpu_memory_gib) if request.is_shared else 1.0
        return best_idle * share, best_latest, soonest, placed

    def _predicted_free(self, profile: NodeProfile) -> list[float]:
        """When each GPU of the node is expected free of what runs on it now: its tasks' predicted ends
        (now for a free GPU); kept until the node's occupants change."""
        cached = self._frees.get(profile.index)
        if cached is not None and cached[0] == profile.version:
            return cached[1]
        frees = [self.now] * profile.node.spec.gpus
        for o in profile.occupants:
            if o.kind == RUNNING:
                for i in o.gpus:
                    if o.pend > frees[i]:
                        frees[i] = o.pend
        self._frees[profile.index] = (profile.version, frees)
        return frees

    def _later_changes(self, nodes: list[NodeProfile], timeline: Timeline, runtime: float,
                       predicted: bool) -> tuple[list[tuple[float, int]], list[tuple[float, int]]]:
        """For the nodes with occupants that start later: when those end, and when a span of ``runtime``
        from t comes to cover their starts (t = start - runtime), each with its node, in order."""
        now = self.now
        ends: list[tuple[float, int]] = []
        comings: list[tuple[float, int]] = []
        for k in timeline.later:
            for o in nodes[k].occupants:
                start, end = (o.pstart, o.pend) if predicted else (o.start, o.end)
                if start > now:
                    comings.append((start - runtime if runtime > 0 else start, k))
                    if end < FOREVER:
                        ends.append((end, k))
        ends.sort()
        comings.sort()
        return ends, comings

    # --- holding room -------------------------------------------------------------------------------

    def _hold(self, profile: NodeProfile) -> None:
        """Hold on the node the room its holding reservations need that is free now."""
        state, node = self.state, profile.node
        self._release(node)
        gpus, cpu, mem = profile.holds(self.now)
        kept: list[tuple[tuple[str, int], TaskRequest]] = []
        for i, amount in enumerate(gpus):
            if amount > EPS:
                key, request = (HOLD, i), TaskRequest(gpus=min(amount, 1.0), cpus=0.0, memory_gib=0.0)
                state.hold(node, key, TaskPlacement(node.name, (i,), min(amount, 1.0)), request)
                kept.append((key, request))
        if cpu > EPS or mem > EPS:
            key, request = (HOLD, -1), TaskRequest(gpus=0.0, cpus=cpu, memory_gib=mem)
            state.hold(node, key, TaskPlacement(node.name, (), 0.0), request)
            kept.append((key, request))
        if kept:
            self.held[node] = kept

    def _release(self, node: NodeState) -> None:
        for key, request in self.held.pop(node, []):
            self.state.unhold(node, key, request)

    def release_all(self) -> None:
        """Give back all the room held: allocation is over (the other actions follow their own rules)."""
        for node in list(self.held):
            self._release(node)

    # --- jobs placed ----------------------------------------------------------------------------------

    def may_borrow(self, job: JobSpec, tasks: int, sid: int = -1) -> bool:
        """True when the job, started now, would end before some holding reservation starts, and no
        job as large ending as late failed to borrow (``sid``: the job's shape number, when known)."""
        return (bool(self.held) and end_of(job, self.now) <= self.latest_hold
                and self.borrow_failed.find(job, tasks, self._own(job), sid) is None)

    def _own(self, job: JobSpec) -> int:
        end = end_of(job, self.now)
        return int(math.ceil(end - self.now)) if end < FOREVER else 1 << 60

    def placed(self, job: JobSpec, placements: list[TaskPlacement]) -> None:
        """Count the tasks just placed in the profile, from now to the end of the job's limit."""
        now, request = self.now, job.request
        end, pend = end_of(job, now), predicted_end(job, now)
        if pend < end:
            self.predicts = True
        for placement in placements:
            profile = self.profiles.get(placement.node)
            if profile is not None:
                self._occupy(profile, Occupant(placement.gpu_index, placement.gpu_share, request.cpus,
                                               request.memory_gib, now, end, now, pend, RUNNING))

    def borrow(self, stmt: Statement, job: JobSpec, place: Callable[[], bool]) -> bool:
        """Try the job on the room held too: kept only if it delays no holding reservation (it ends
        before, or uses room none needs). ``place`` places it on ``stmt``, True when placed."""
        held = list(self.held)
        for node in held:
            self._release(node)
        waiting = self.state.pending_tasks(job.id)
        mark = stmt.checkpoint()
        ok = place()
        if ok:
            slots = self.state.placements[job.id]
            new = [p for p in (slots[i] for i in waiting) if p is not None]
            touched = {p.node: self.profiles[p.node] for p in new if p.node in self.profiles}
            sizes = {name: len(profile.occupants) for name, profile in touched.items()}
            self.placed(job, new)
            if any(profile.overbooked(self.now) for profile in touched.values()):
                for name, profile in touched.items():
                    self._truncate(profile, sizes[name])
                stmt.rollback(mark)
                ok = False
        for node in held:
            self._hold(self.profiles[node.name])
        if not ok:
            self.borrow_failed.add(job, max(len(waiting), 1) if job.gang_minimum >= job.tasks else 1, None,
                                   "", self._own(job))
        return ok


def plans_somewhere(state: ClusterState) -> bool:
    """True when some pool with nodes plans reservations or estimates (its ``jobs`` or ``estimate_jobs``)."""
    for name, index in state.indexes.items():
        settings = state.policy.reservations_in(name)
        if (settings.jobs or settings.estimate_jobs) and index.nodes:
            return True
    return False


class Planner:
    """Reservations and estimates for one allocation, pool by pool (``PoolPlan``), into ``out``."""

    def __init__(self, state: ClusterState, out: dict[str, Reservation]) -> None:
        self.state = state
        self.out = out
        # Without a job that has a time limit no room is ever known to free, and without a pool that
        # plans starts nothing is asked: nothing to plan, and allocation goes as without reservations.
        self.active = state.limited > 0 and plans_somewhere(state)
        self.pools: dict[str, PoolPlan | None] = {}

    def pool(self, job: JobSpec) -> PoolPlan | None:
        """The plan of the job's pool, made when first asked; None when the pool plans nothing."""
        name = self.state.pool_of(job)
        if name in self.pools:
            return self.pools[name]
        settings = self.state.policy.reservations_in(name)
        index = self.state.indexes.get(name)
        made = None
        if (settings.jobs or settings.estimate_jobs) and index is not None and index.nodes:
            made = PoolPlan(self.state, index, settings)
        self.pools[name] = made
        return made

    def may_borrow(self, job: JobSpec, tasks: int, sid: int = -1) -> bool:
        """True when the job may try the room held in its pool (``PoolPlan.may_borrow``)."""
        plan = self.pools.get(self.state.pool_of(job))
        return plan is not None and plan.may_borrow(job, tasks, sid)

    def placed(self, job: JobSpec, tasks: list[int]) -> None:
        """Count tasks just placed (their indices) in the pool's profile, if it has one yet."""
        plan = self.pools.get(self.state.pool_of(job))
        if plan is not None:
            slots = self.state.placements[job.id]
            plan.placed(job, [p for p in (slots[i] for i in tasks) if p is not None])

    def borrow(self, stmt: Statement, job: JobSpec, tasks: int, place: Callable[[], bool]) -> bool:
        """``PoolPlan.borrow`` in the job's pool; False when it may not borrow there."""
        plan = self.pools.get(self.state.pool_of(job))
        return plan is not None and plan.may_borrow(job, tasks) and plan.borrow(stmt, job, place)

    def plan(self, job: JobSpec, tasks: int, entitled: bool) -> None:
        """Plan the start of a job that found no room (``PoolPlan.plan``), kept in ``out``."""
        plan = self.pool(job)
        if plan is None or job.id in self.out:  # planned once a cycle
            return
        found = plan.plan(job, tasks, entitled)
        if found is not None:
            self.out[job.id] = found

    def plans_more(self, pool: str) -> bool:
        """True when the pool gives more jobs an estimate this cycle."""
        name = pool or self.state.policy.default_pool
        plan = self.pools.get(name)
        if name not in self.pools:
            settings = self.state.policy.reservations_in(name)
            return bool(settings.jobs or settings.estimate_jobs)
        return plan is not None and plan.estimates < plan.settings.estimate_jobs

    def plan_new(self, job: JobSpec, tasks: int) -> bool:
        """Plan the estimate of a job not planned yet this cycle (``PoolPlan.plan``, holding no room);
        True when it got one."""
        if job.id in self.out:
            return False
        self.plan(job, tasks, False)
        return job.id in self.out

    def keeps(self) -> bool:
        """True when every pool's holding reservations still have their room (``PoolPlan.keeps``):
        what an action that evicts placed must leave them, or be undone."""
        for plan in self.pools.values():
            if plan is not None and plan.held_nodes and not plan.keeps():
                return False
        return True

    def holds_room(self, pool: str) -> bool:
        """True when the pool holds room for a reservation now."""
        plan = self.pools.get(pool)
        return plan is not None and bool(plan.held)

    def release_all(self) -> None:
        """Give back every pool's held room."""
        for plan in self.pools.values():
            if plan is not None:
                plan.release_all()
