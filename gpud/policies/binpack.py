"""Bin-pack placement: the fullest node and the fullest GPU that still fit the task."""

from __future__ import annotations

from typing import Iterator

from gpud import hookimpl
from gpud.core.nodes import NodeIndex, NodeState
from gpud.model import TaskRequest

NAME = "binpack"


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


def _candidates(request: TaskRequest, index: NodeIndex) -> Iterator[NodeState]:
    if not request.uses_gpu:
        yield from index.with_free_cpus(request.cpus)
    elif request.is_shared:
        share = smallest_share(request, index)
        yield from unique(node for node, _ in index.shared_gpus(share, cpus=request.cpus))
        yield from index.with_free_gpus(1, cpus=request.cpus)
    else:
        yield from index.with_free_gpus(request.whole_gpus, cpus=request.cpus)


@hookimpl
def gpud_placement_strategies():
    return [NAME]


@hookimpl
def gpud_node_candidates(strategy, request, index):
    if strategy != NAME:
        return None
    return _candidates(request, index)


@hookimpl
def gpud_gpu_order(strategy, request, node):
    if strategy != NAME:
        return None
    free = node.free_share
    return sorted(range(len(free)), key=lambda i: (free[i], i))
