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

from gpud.core.nodes import NodeIndex, NodeState
from gpud.model import EPS, TaskRequest

__all__ = ["CPU_WEIGHT", "GPU_WEIGHT", "MEMORY_WEIGHT", "BinPack", "Spread", "Strategy", "leftover",
           "smallest_share", "unique"]


# What bin-pack's leftover counts, each resource relative to the pool's largest node: GPUs (whole and
# the free part of shared ones) most, as they are what strands; CPUs and memory less, so nodes with
# host resources to spare stay free for the tasks that need them. Chosen on the Alibaba trace
# (docs/trace.md): GPUs weighed 1-4 against CPUs, memory 0-1.
GPU_WEIGHT: Final = 1.0
CPU_WEIGHT: Final = 1.0 / 3.0
MEMORY_WEIGHT: Final = 0.1


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
        gpu_w = GPU_WEIGHT / max(index.max_gpus, 1)
        cpu_w = CPU_WEIGHT / max(index.max_cpus, 1)
        # Every node that holds the task has at least the task's CPUs and memory free.
        mem_floor = MEMORY_WEIGHT * request.memory_gib / max(index.max_memory, 1.0)
        # Each part walks its nodes from the emptiest resource up, so a part stops once a node there cannot
        # beat the best found (``_floor``); the rest is scored only when the caller asks past the best.
        parts: list[tuple[Iterator[NodeState], int]]
        if not request.uses_gpu:
            parts = [(index.with_free_cpus(request.cpus), _BY_CPUS)]
        elif request.is_shared:
            share = smallest_share(request, index)
            parts = [(_nodes_of(index.shared_gpus(share, cpus=request.cpus)), _UNORDERED),
                     (index.with_free_gpus(1, cpus=request.cpus), _BY_WHOLE)]
        else:
            parts = [(index.with_free_gpus(request.whole_gpus, cpus=request.cpus), _BY_WHOLE)]
        seen: set[str] = set()
        scored: list[tuple[float, int, NodeState]] = []
        best = math.inf
        for nodes, walk in parts:
            for node in nodes:
                if node.name in seen or not node.holds_host_resources(request):
                    continue
                seen.add(node.name)
                score = leftover(node, index)
                scored.append((score, len(scored), node))
                if score < best:
                    best = score
                elif walk != _UNORDERED and _floor(node, request, walk, gpu_w, cpu_w) + mem_floor >= best:
                    break
        if not scored:
            return
        first = min(scored, key=_rank)[1]  # by position: a compiled core copies tuples, so "is" cannot tell
        yield scored[first][2]
        for nodes, walk in parts:  # what the first pass left unread
            for node in nodes:
                if node.name not in seen and node.holds_host_resources(request):
                    seen.add(node.name)
                    scored.append((leftover(node, index), len(scored), node))
        scored.sort(key=_rank)
        for item in scored:
            if item[1] != first:
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


def leftover(node: NodeState, index: NodeIndex) -> float:
    """The node's free capacity, weighted (``GPU_WEIGHT``, ``CPU_WEIGHT``, ``MEMORY_WEIGHT``), each
    resource as a share of the largest node of the pool: 0 for a full node, up to the weights' sum.

    A task takes the same from any node that holds it, so ranking nodes by this
    before placement ranks them by what the task would leave free."""
    return (GPU_WEIGHT * sum(node.free_share) / max(index.max_gpus, 1)
            + CPU_WEIGHT * node.free_cpu / max(index.max_cpus, 1)
            + MEMORY_WEIGHT * node.free_mem / max(index.max_memory, 1.0))


_UNORDERED: Final = 0
_BY_WHOLE: Final = 1
_BY_CPUS: Final = 2


def _floor(node: NodeState, request: TaskRequest, walk: int, gpu_w: float, cpu_w: float) -> float:
    """The least GPU and CPU leftover of this node and of every node after it in its walk (nodes that
    hold the task): whole free GPUs only grow along ``with_free_gpus``, CPU buckets along
    ``with_free_cpus``."""
    if walk == _BY_WHOLE:
        return gpu_w * node.free_whole + cpu_w * request.cpus
    return cpu_w * max(float(int(node.free_cpu + EPS)), request.cpus)


def _rank(item: tuple[float, int, NodeState]) -> tuple[float, int]:
    return item[0], item[1]
