"""The built-in placement strategies, bin-pack and spread, as the core runs them.

The plugins gpud.policies.binpack and gpud.policies.spread answer their hooks
with these functions. Each hook function names the strategies it answers for
(``ANSWERS``) and the core function it answers with (``NATIVE``): when the
built-ins alone decide a strategy (``gpud.core.hooks.strategy_function``), the
core calls the function itself, which the compiled core (GPUD_COMPILE) runs
compiled.
"""

from __future__ import annotations

from typing import Iterator

from gpud.core.hooks import ANSWERS, NATIVE
from gpud.core.nodes import NodeIndex, NodeState
from gpud.model import TaskRequest

__all__ = ["ANSWERS", "NATIVE", "binpack_candidates", "binpack_gpu_order", "smallest_share",
           "spread_candidates", "spread_gpu_order", "unique"]


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


def binpack_candidates(request: TaskRequest, index: NodeIndex) -> Iterator[NodeState]:
    """Bin-pack: the fullest nodes that still hold the task first (partly used GPUs first for a fraction)."""
    if not request.uses_gpu:
        yield from index.with_free_cpus(request.cpus)
    elif request.is_shared:
        share = smallest_share(request, index)
        yield from unique(_nodes_of(index.shared_gpus(share, cpus=request.cpus)))
        yield from index.with_free_gpus(1, cpus=request.cpus)
    else:
        yield from index.with_free_gpus(request.whole_gpus, cpus=request.cpus)


def spread_candidates(request: TaskRequest, index: NodeIndex) -> Iterator[NodeState]:
    """Spread: the emptiest nodes first (whole free GPUs before partly used ones for a fraction)."""
    if not request.uses_gpu:
        yield from index.with_free_cpus(request.cpus, most_free_first=True)
    elif request.is_shared:
        yield from index.with_free_gpus(1, most_free_first=True, cpus=request.cpus)
        share = smallest_share(request, index)
        yield from unique(_nodes_of(index.shared_gpus(share, most_free_first=True, cpus=request.cpus)))
    else:
        yield from index.with_free_gpus(request.whole_gpus, most_free_first=True, cpus=request.cpus)


def binpack_gpu_order(request: TaskRequest, node: NodeState) -> list[int]:
    """The node's GPUs, fullest first (then lowest index)."""
    free = node.free_share
    return sorted(range(len(free)), key=free.__getitem__)  # a stable sort: equal shares keep index order


def spread_gpu_order(request: TaskRequest, node: NodeState) -> list[int]:
    """The node's GPUs, emptiest first (then lowest index)."""
    free = node.free_share
    return sorted(range(len(free)), key=free.__getitem__, reverse=True)  # stable: ties keep index order
