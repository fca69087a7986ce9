"""Spread placement: the emptiest node and the emptiest GPU, to leave the most room per task."""

from __future__ import annotations

from typing import Iterator

from gpud import hookimpl
from gpud.core.nodes import NodeIndex, NodeState
from gpud.model import TaskRequest
from gpud.policies.binpack import smallest_share, unique

NAME = "spread"


def _candidates(request: TaskRequest, index: NodeIndex) -> Iterator[NodeState]:
    if not request.uses_gpu:
        yield from index.with_free_cpus(request.cpus, most_free_first=True)
    elif request.is_shared:
        yield from index.with_free_gpus(1, most_free_first=True, cpus=request.cpus)
        share = smallest_share(request, index)
        yield from unique(node for node, _ in index.shared_gpus(share, most_free_first=True, cpus=request.cpus))
    else:
        yield from index.with_free_gpus(request.whole_gpus, most_free_first=True, cpus=request.cpus)


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
    return sorted(range(len(free)), key=lambda i: (-free[i], i))
