"""Shrinking a trace's cluster to a documented, seeded subset of its nodes."""

from __future__ import annotations

import random
from typing import Sequence

from gpud.model import NodeSpec


def scale_nodes(nodes: Sequence[NodeSpec], factor: float, seed: int = 0) -> list[NodeSpec]:
    """About ``factor`` of the nodes, drawn at random with ``seed``, in their original order.

    At least one node of every GPU count present (1, 2, 4, 8, ...) is kept,
    the largest such node first, so every pod shape of the trace still fits
    somewhere. ``factor`` >= 1 keeps every node.
    """
    if factor >= 1:
        return list(nodes)
    if factor <= 0:
        raise ValueError("scale must be above 0")
    rng = random.Random(seed)
    count = max(1, round(len(nodes) * factor))
    keep = set(rng.sample(range(len(nodes)), count))
    by_gpus: dict[int, list[int]] = {}
    for i, node in enumerate(nodes):
        by_gpus.setdefault(node.gpus, []).append(i)
    for members in by_gpus.values():
        if not keep.intersection(members):
            keep.add(max(members, key=lambda i: (nodes[i].cpus, nodes[i].memory_gib, -i)))
    return [node for i, node in enumerate(nodes) if i in keep]
