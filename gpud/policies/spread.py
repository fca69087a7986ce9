"""Spread placement: the emptiest node and the emptiest GPU, to leave the most room per task."""

from __future__ import annotations

from gpud import hookimpl
from gpud.core.strategies import ANSWERS, NATIVE, spread_candidates, spread_gpu_order

NAME = "spread"


@hookimpl
def gpud_placement_strategies():
    return [NAME]


@hookimpl
def gpud_node_candidates(strategy, request, index):
    if strategy != NAME:
        return None
    return spread_candidates(request, index)


@hookimpl
def gpud_gpu_order(strategy, request, node):
    if strategy != NAME:
        return None
    return spread_gpu_order(request, node)


# The core may call these itself for this strategy (gpud.core.hooks.strategy_function).
for _hook, _native in ((gpud_node_candidates, spread_candidates), (gpud_gpu_order, spread_gpu_order)):
    setattr(_hook, ANSWERS, (NAME,))
    setattr(_hook, NATIVE, _native)
