"""Placement strategies: the class the core calls, and the built-in bin-pack (best fit) and spread.

A strategy is an object that names the strategies it implements
(``Strategy.names``) and answers the placement hooks for them with its
methods: ``gpud_node_candidates`` with ``candidates``, ``gpud_gpu_order``
with ``gpu_order``. The plugins gpud.policies.binpack and
gpud.policies.spread are objects of the built-in classes below; the core,
which reads the plugins once (gpud.core.policy_set), calls the methods
itself, and passes a strategy object by, without a call, for the strategies
it does not name. With a compiled core (GPUD_COMPILE) the built-ins run
compiled. gpud.policies.fragaware is a strategy object too.
"""

from __future__ import annotations

import math
from typing import Final, Iterable, Iterator

from mypy_extensions import mypyc_attr

from gpud.core.nodes import (CPU_WEIGHT, GPU_WEIGHT, MEMORY_WEIGHT, FitEntry, NodeIndex, NodeState, cpu_class,
                             leftover)
from gpud.model import TaskRequest

__all__ = ["CPU_WEIGHT", "GPU_WEIGHT", "MEMORY_WEIGHT", "BinPack", "Spread", "Strategy", "leftover",
           "smallest_share", "unique"]


@mypyc_attr(allow_interpreted_subclasses=True)
class Strategy:
    """Placement strategies of one kind: the nodes for a task, and the GPUs of a node, best first.

    Each method takes the arguments of its hook, the strategy's name first,
    and is asked only for a name in ``names``.
    """

    def __init__(self, names: tuple[str, ...]) -> None:
        self.names = names

    def candidates(self, strategy: str, request: TaskRequest, index: NodeIndex) -> Iterator[NodeState] | None:
        """The pool's nodes that might hold one task of ``request``, best first (lazily), or None to
        leave the answer to the next plugin."""
        return None

    def gpu_order(self, strategy: str, request: TaskRequest, node: NodeState) -> Iterable[int] | None:
        """The node's GPU indices for the task, best first, or None to leave the answer to the next plugin."""
        return None


@mypyc_attr(allow_interpreted_subclasses=True)
class BinPack(Strategy):
    """Bin-pack (best fit): the fullest node and the fullest GPU that still hold the task."""

    def __init__(self) -> None:
        super().__init__(("binpack",))

    def candidates(self, strategy: str, request: TaskRequest, index: NodeIndex) -> Iterator[NodeState]:
        """Every node that holds the task, the one the task would leave least free first (``leftover``:
        GPUs, fractions of GPUs, CPUs and memory); ties keep the fullest GPUs first."""
        # The best node: the partly used GPUs are scored one by one (few); each ordered part's buckets
        # keep their nodes by leftover (``NodeIndex.fit_whole``, ``fit_cpu``), so a bucket's best is at
        # its front, and a bucket whose least possible leftover cannot beat the best is not read.
        seen: set[str] = set()
        best, first = math.inf, None
        for nodes, walk in _parts(request, index):
            if walk == _UNORDERED:
                for node in nodes:
                    if node.name not in seen and node.holds_host_resources(request):
                        seen.add(node.name)
                        score = leftover(node, index)
                        if score < best:
                            best, first = score, node
            else:
                found = _best_in_buckets(request, index, walk, best, seen)
                if found is not None:
                    best, first = found
        if first is None:
            return
        yield first
        # The others, scored only when the caller asks past the best (its first choice refused).
        seen = {first.name}
        scored: list[tuple[float, int, NodeState]] = []
        for nodes, walk in _parts(request, index):
            for node in nodes:
                if node.name not in seen and node.holds_host_resources(request):
                    seen.add(node.name)
                    scored.append((leftover(node, index), len(scored), node))
        scored.sort(key=_rank)
        for item in scored:
            yield item[2]

    def gpu_order(self, strategy: str, request: TaskRequest, node: NodeState) -> list[int]:
        """The node's GPUs, fullest first (then lowest index)."""
        free = node.free_share
        return sorted(range(len(free)), key=free.__getitem__)  # a stable sort: equal shares keep index order


@mypyc_attr(allow_interpreted_subclasses=True)
class Spread(Strategy):
    """Spread: the emptiest node and the emptiest GPU, to leave the most room per task."""

    def __init__(self) -> None:
        super().__init__(("spread",))

    def candidates(self, strategy: str, request: TaskRequest, index: NodeIndex) -> Iterator[NodeState]:
        """The emptiest nodes first (whole free GPUs before partly used ones for a fraction)."""
        if not request.uses_gpu:
            yield from index.with_free_cpus(request.cpus, most_free_first=True)
        elif request.is_shared:
            yield from index.with_free_gpus(1, most_free_first=True, cpus=request.cpus)
            share = smallest_share(request, index)
            yield from unique(_nodes_of(index.shared_gpus(share, most_free_first=True, cpus=request.cpus)))
        else:
            yield from index.with_free_gpus(request.whole_gpus, most_free_first=True, cpus=request.cpus)

    def gpu_order(self, strategy: str, request: TaskRequest, node: NodeState) -> list[int]:
        """The node's GPUs, emptiest first (then lowest index)."""
        free = node.free_share
        return sorted(range(len(free)), key=free.__getitem__, reverse=True)  # stable: ties keep index order


def smallest_share(request: TaskRequest, index: NodeIndex) -> float:
    """The least share of one GPU a shared task can take anywhere in the pool."""
    if request.gpu_memory_gib is not None:
        return request.gpu_memory_gib / (index.max_gpu_memory or request.gpu_memory_gib)
    return request.gpus


def unique(nodes: Iterator[NodeState]) -> Iterator[NodeState]:
    """The nodes of ``nodes`` without repeats, in order."""
    seen: set[str] = set()
    for node in nodes:
        if node.name not in seen:
            seen.add(node.name)
            yield node


def _nodes_of(shared: Iterator[tuple[NodeState, int]]) -> Iterator[NodeState]:
    """The node of each (node, GPU index) pair."""
    for node, _ in shared:
        yield node


_UNORDERED: Final = 0
_BY_WHOLE: Final = 1
_BY_CPUS: Final = 2


def _parts(request: TaskRequest, index: NodeIndex) -> list[tuple[Iterator[NodeState], int]]:
    """The nodes that might hold the task, in parts, each as the index walks it, with the way it is
    ordered: a fraction's partly used GPUs first, then nodes by whole GPUs free (CPU-only: by CPUs free)."""
    if not request.uses_gpu:
        return [(index.with_free_cpus(request.cpus), _BY_CPUS)]
    if request.is_shared:
        share = smallest_share(request, index)
        return [(_nodes_of(index.shared_gpus(share, cpus=request.cpus)), _UNORDERED),
                (index.with_free_gpus(1, cpus=request.cpus), _BY_WHOLE)]
    return [(index.with_free_gpus(request.whole_gpus, cpus=request.cpus), _BY_WHOLE)]


def _best_in_buckets(request: TaskRequest, index: NodeIndex, walk: int, best: float,
                     seen: set[str]) -> tuple[float, NodeState] | None:
    """(leftover, node) of the node of an ordered part (``walk``) that holds the task and leaves less
    free than ``best``, the least, the first in the walk among equals; None when none does. Nodes in
    ``seen`` were scored already. A bucket is read from its front (``NodeIndex.fit_whole``,
    ``fit_cpu``) up to its first node that holds the task, and the walk stops at a bucket whose least
    possible leftover cannot beat the best: whole free GPUs only grow along it (CPU buckets likewise),
    and a node that holds the task has at least its CPUs and memory free."""
    index.sort_fits()
    cpu_w = CPU_WEIGHT / max(index.max_cpus, 1)
    mem_floor = MEMORY_WEIGHT * request.memory_gib / max(index.max_memory, 1.0)
    found: NodeState | None = None
    buckets: list[tuple[float, list[FitEntry]]] = []
    if walk == _BY_WHOLE:
        gpu_w = GPU_WEIGHT / max(index.max_gpus, 1)
        low = 1 if request.is_shared else max(request.whole_gpus, 0)
        for k in range(low, index.max_gpus + 1):
            floor = gpu_w * k + cpu_w * request.cpus + mem_floor
            buckets.extend((floor, fits) for fits in index.fit_whole[k][cpu_class(request.cpus):])
    else:
        for k in range(max(int(request.cpus), 0), index.max_cpus + 1):
            buckets.append((cpu_w * max(float(k), request.cpus) + mem_floor, index.fit_cpu[k]))
    for floor, fits in buckets:
        if floor >= best:
            break
        for entry in fits:
            score, node = entry[0], entry[2]
            if score >= best:
                break
            if node.name not in seen and node.holds_host_resources(request):
                best, found = score, node
                break
    return None if found is None else (best, found)


def _rank(item: tuple[float, int, NodeState]) -> tuple[float, int]:
    return item[0], item[1]
