"""Rooms made by eviction: what one node would have free without some victims, and the node to clear.

The search walks victims in victim order and counts each one's tasks as
gone from the nodes they sit on. With an order that weighs lost work
(``VictimOrder.weighs_lost_work``) it chooses, among the nodes that could
be cleared, the set of victims that loses the fewest GPU-seconds;
otherwise the node whose needed victims come earliest in the order.
"""

from __future__ import annotations

from typing import Iterable

from gpud.core.nodes import NodeState
from gpud.core.placement import Placer, largest_fit
from gpud.core.state import ClusterState, Victim
from gpud.core.victims_by_node import VictimsByNode
from gpud.model import EPS, JobSpec, TaskPlacement, TaskRequest


class NodeRoom:
    """What one node would have free if some victims' tasks on it were gone (nothing is changed).

    ``want`` is the share of one GPU a shared task takes here (less the
    tolerance), None when the node's GPUs are too small for it; ``freed_*``
    add up what the victims' tasks here hold.
    """

    __slots__ = ("node", "share", "copied", "whole", "cpu", "mem", "victims", "want", "freed_gpu", "freed_cpu",
                 "freed_mem")

    def __init__(self, node: NodeState, want: float | None) -> None:
        self.node = node
        self.share = node.free_share  # copied before the first change
        self.copied = False
        self.whole = node.free_whole
        self.cpu = node.free_cpu
        self.mem = node.free_mem
        self.victims: list[Victim] = []
        self.want = want
        self.freed_gpu = self.freed_cpu = self.freed_mem = 0.0

    def free(self, victim: Victim, placement: TaskPlacement) -> None:
        """Count the victim's task at ``placement`` (on this node) as gone."""
        gpu_index = placement.gpu_index
        if gpu_index:
            gpu_share = placement.gpu_share
            share = self.share
            if not self.copied:
                share = self.share = list(share)
                self.copied = True
            for i in gpu_index:
                before = share[i]
                after = before + gpu_share
                if after >= _FULL:
                    after = 1.0
                    if before < _FULL:
                        self.whole += 1
                share[i] = after
            self.freed_gpu += gpu_share * len(gpu_index)
        request = victim.job.request
        self.cpu += request.cpus
        self.mem += request.memory_gib
        self.freed_cpu += request.cpus
        self.freed_mem += request.memory_gib
        victims = self.victims
        if not victims or victims[-1] is not victim:
            victims.append(victim)


_FULL = 1.0 - EPS  # a GPU's share at least this free is a whole free GPU


def wanted_share(request: TaskRequest, gpu_memory_gib: float) -> float | None:
    """The share of one GPU of ``gpu_memory_gib`` a shared task takes, less the tolerance; None if it cannot."""
    if request.gpu_memory_gib is not None and request.gpu_memory_gib > gpu_memory_gib + EPS:
        return None
    return request.gpu_share_on(gpu_memory_gib) - EPS



def cheapest_room(state: ClusterState, placer: Placer, job: JobSpec, ordered: Iterable[Victim],
                  usable: dict[int, bool], must: tuple[float, float, float] | None = None,
                  holdings: VictimsByNode | None = None,
                  weigh: bool = False) -> NodeRoom | None:
    """The node that can hold one more task of ``job`` after evicting some of the victims, and which.

    Victims are added in victim order, each to the nodes its tasks sit on.
    Without ``weigh``, the first node that would fit is the one whose needed
    victims come earliest in that order. With ``weigh`` (an order that
    weighs lost work, ``VictimOrder.weighs_lost_work``), the room chosen is
    the one whose victims lose the fewest GPU-seconds in all, among rooms
    of equal highest victim priority, the lowest such priority first: each
    node's victims in order until the task fits, less those it fits
    without, and each victim that alone would clear a node. No victim
    evicted then loses more than another allowed victim alone would have.
    ``usable`` remembers, by node kind, whether the node could hold a task
    of the job at all. With ``must``, the victims' tasks on the node must
    also hold at least that many GPUs, CPUs and memory; ``holdings``, at least
    what the victims hold by node, then passes over nodes where they cannot.
    A memory slice takes less of a larger GPU than ``ClusterState.task_need``
    counts, so where it goes on one, its victims need free that much fewer
    GPUs (``must_gpu_on``). A node a filter plugin refuses the job
    (``Placer.allows``) is never chosen.
    """
    choice = _NodeChoice(state, placer, job, usable, must, holdings)
    return choice.least_lost_room(ordered) if weigh else choice.first_room(ordered)


class _NodeChoice:
    """The search of ``cheapest_room``: what each node would have free without the victims seen so far."""

    def __init__(self, state: ClusterState, placer: Placer, job: JobSpec, usable: dict[int, bool],
                 must: tuple[float, float, float] | None,
                 holdings: VictimsByNode | None) -> None:
        self.state = state
        self.placer = placer
        self.job = job
        self.pool = state.pool_of(job)
        self.usable = usable
        self.rooms: dict[str, NodeRoom | None] = {}  # None: a node that cannot be cleared for the job
        self.wants: dict[float, float | None] = {}  # ``wanted_share`` by the GPUs' memory
        request = job.request
        # The request's numbers, read once: its properties are worked out at every read.
        self.cpus, self.mem = request.cpus - EPS, request.memory_gib - EPS
        self.uses_gpu, self.shared, self.whole = request.uses_gpu, request.is_shared, request.whole_gpus
        self.must = must
        self.must_gpu, self.must_cpu, self.must_mem = (
            (must[0] - EPS, must[1] - EPS, must[2] - EPS) if must is not None else (0.0, 0.0, 0.0))
        self.holdings = holdings if must is not None else None
        self.enough = enough_held(must) if must is not None else _NOTHING
        # For a memory slice: the GPUs its queue counts it for (on the smallest GPU that holds it), -1 otherwise.
        self.slice_need = state.task_need(job).gpu if must is not None and request.gpu_memory_gib is not None else -1.0

    def first_room(self, ordered: Iterable[Victim]) -> NodeRoom | None:
        """Count the victims' tasks as gone, one victim after the other, from the nodes they sit on; the
        first node that would then hold the task, or None."""
        rooms, placements = self.rooms, self.state.placements
        for victim in ordered:
            for placement in placements[victim.job.id]:
                if placement is None:
                    continue
                name = placement.node
                room = rooms[name] if name in rooms else self._open(name)
                if room is None:
                    continue
                room.free(victim, placement)
                if self._holds_task(room):
                    return room
        return None

    def least_lost_room(self, ordered: Iterable[Victim]) -> NodeRoom | None:
        """The room whose victims lose the fewest GPU-seconds (``cheapest_room`` with ``weigh``), or None.

        ``ordered`` is in an order whose key is the priority, then the work
        lost: once a victim comes that is of a higher priority than the best
        room's victims, or loses as much as they do in all, no room still to
        be found could lose less, and the search stops there.
        """
        rooms, placements = self.rooms, self.state.placements
        best: NodeRoom | None = None
        best_priority = 0
        best_lost = 0.0
        complete: set[str] = set()  # nodes whose room already holds the task: it takes no more victims
        turns = self.state.turns
        for victim in ordered:
            turns.step()
            priority = victim.job.priority
            lost = victim.lost_gpu_seconds
            if best is not None and (priority > best_priority
                                     or (priority == best_priority and lost >= best_lost - EPS)):
                break
            alone: list[str] = []
            for placement in placements[victim.job.id]:
                if placement is None:
                    continue
                name = placement.node
                room = rooms[name] if name in rooms else self._open(name)
                if room is None:
                    continue
                if name in complete:
                    if name not in alone:
                        alone.append(name)
                    continue
                room.free(victim, placement)
                if not self._holds_task(room):
                    continue
                complete.add(name)
                room = self._needed(room)
                most, total = _cost(room)
                if best is None or most < best_priority or (most == best_priority and total < best_lost - EPS):
                    best, best_priority, best_lost = room, most, total
            for name in alone:  # a node cleared by earlier victims, which this one alone might clear too
                if best is not None and priority == best_priority and lost >= best_lost - EPS:
                    break
                room = self._room_of(name, [victim])
                if self._holds_task(room):
                    best, best_priority, best_lost = room, priority, lost
        return best

    def _needed(self, room: NodeRoom) -> NodeRoom:
        """The room with only the victims the task needs: each but the last (whose coming made the task
        fit) is left out, the latest in the order first, where the task fits without it."""
        victims = room.victims
        if len(victims) < 2:
            return room
        kept = list(victims)
        for victim in reversed(victims[:-1]):
            trial = [v for v in kept if v is not victim]
            if self._holds_task(self._room_of(room.node.name, trial)):
                kept = trial
        return room if len(kept) == len(victims) else self._room_of(room.node.name, kept)

    def _room_of(self, name: str, victims: list[Victim]) -> NodeRoom:
        """The room of node ``name`` (one ``_open`` accepted) were only these victims' tasks on it gone."""
        node = self.state.nodes[name]
        room = NodeRoom(node, self._wanted_share(node) if self.shared else None)
        placements = self.state.placements
        for victim in victims:
            for placement in placements[victim.job.id]:
                if placement is not None and placement.node == name:
                    room.free(victim, placement)
        return room

    def _open(self, name: str) -> NodeRoom | None:
        """The room of a node seen for the first time: None when clearing it could not serve the job."""
        node = self.state.nodes[name]
        could_hold = self.usable.get(node.kind)
        if could_hold is None:
            could_hold = self._could_hold(node)
        room = None
        if (could_hold and (self.holdings is None or self._victims_hold_enough(name))
                and (not self.placer.filters or self.placer.allows(self.job, node))):
            room = NodeRoom(node, self._wanted_share(node) if self.shared else None)
        self.rooms[name] = room
        return room

    def _could_hold(self, node: NodeState) -> bool:
        """Whether the node, were it empty, could hold a task of the job: kept by node kind (``usable``)."""
        job = self.job
        fits = self.usable[node.kind] = (node.pool == self.pool and node.spec.schedulable
                                         and largest_fit(node, job) and node.matches(job.node_selector))
        return fits

    def _victims_hold_enough(self, name: str) -> bool:
        """False when the victims on the node hold less than ``must`` (as ``holdings`` sums them up)."""
        if self.holdings is None:
            return True
        gpu, cpu, mem = self.enough
        if self.slice_need >= 0.0:
            want = self._wanted_share(self.state.nodes[name])
            if want is None:
                return False
            gpu = must_gpu_on(gpu, self.slice_need, want + EPS)
        return self.holdings.holds(name, gpu, cpu, mem)

    def _wanted_share(self, node: NodeState) -> float | None:
        """The share of one of the node's GPUs a shared task of the job takes (``wanted_share``)."""
        size = node.gpu_memory_gib
        if size not in self.wants:
            self.wants[size] = wanted_share(self.job.request, size)
        return self.wants[size]

    def _holds_task(self, room: NodeRoom) -> bool:
        """Whether the room would hold one task of the job, its victims freeing at least ``must``."""
        if self.cpus > room.cpu or self.mem > room.mem:
            return False
        if self.must is not None:
            must_gpu = self.must_gpu
            if self.slice_need >= 0.0:
                if room.want is None:
                    return False
                must_gpu = must_gpu_on(must_gpu, self.slice_need, room.want + EPS)
            if room.freed_gpu < must_gpu or room.freed_cpu < self.must_cpu or room.freed_mem < self.must_mem:
                return False
        if not self.uses_gpu:
            return True
        if self.shared:
            return room.want is not None and max(room.share) >= room.want
        return room.whole >= self.whole


_NOTHING = (0.0, 0.0, 0.0)


def enough_held(must: tuple[float, float, float]) -> tuple[float, float, float]:
    """What the victims on a node must hold at least (GPUs, CPUs, memory) for their eviction to free ``must``
    there: ``must`` less the tolerance, and one more, as the sums by node may round apart from a room's."""
    return must[0] - EPS - EPS, must[1] - EPS - EPS, must[2] - EPS - EPS


def must_gpu_on(must_gpu: float, counted: float, share: float) -> float:
    """The GPUs victims must free (``must_gpu``, worked out for a task counted as ``counted`` GPUs) where
    the task takes ``share`` of one GPU instead: a memory slice on a GPU larger than the one it was
    counted on takes its queue that much less over. At most ``must_gpu``; may be below zero (nothing)."""
    return must_gpu - (counted - share)


def least_must(state: ClusterState, job: JobSpec,
               must: tuple[float, float, float]) -> tuple[float, float, float]:
    """``must`` (what victims must free where one task of ``job`` goes) where it is least: on the largest
    GPU of the job's pool for a memory slice (``must_gpu_on``), else ``must`` itself."""
    request = job.request
    if request.gpu_memory_gib is None or must[0] <= 0.0:
        return must
    index = state.indexes.get(state.pool_of(job))
    if index is None or not index.gpu_memories:
        return must
    least = must_gpu_on(must[0], state.task_need(job).gpu, request.gpu_share_on(index.gpu_memories[-1]))
    return (least if least > 0.0 else 0.0), must[1], must[2]


def _cost(room: NodeRoom) -> tuple[int, float]:
    """The highest priority among the room's victims, and the GPU-seconds they lose in all."""
    most = 0
    total = 0.0
    for i, victim in enumerate(room.victims):
        priority = victim.job.priority
        if i == 0 or priority > most:
            most = priority
        total += victim.lost_gpu_seconds
    return most, total
