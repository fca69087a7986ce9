"""Bin-pack placement: the fullest node and the fullest GPU that still fit the task."""

from __future__ import annotations

from gpud import hookimpl
from gpud.core.strategies import (ANSWERS, NATIVE, binpack_candidates, binpack_gpu_order, smallest_share,
                                  unique)

NAME = "binpack"

__all__ = ["NAME", "smallest_share", "unique"]


@hookimpl
def gpud_placement_strategies():
    return [NAME]


@hookimpl
def gpud_node_candidates(strategy, request, index):
    if strategy != NAME:
        return None
    return binpack_candidates(request, index)


@hookimpl
def gpud_gpu_order(strategy, request, node):
    if strategy != NAME:
        return None
    return binpack_gpu_order(request, node)


# The core may call these itself for this strategy (gpud.core.hooks.strategy_function).
for _hook, _native in ((gpud_node_candidates, binpack_candidates), (gpud_gpu_order, binpack_gpu_order)):
    setattr(_hook, ANSWERS, (NAME,))
    setattr(_hook, NATIVE, _native)
