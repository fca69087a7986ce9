"""Spread placement: the emptiest node and the emptiest GPU, to leave the most room per task."""

from __future__ import annotations

from gpud import hookimpl
from gpud.core.strategies import Spread

NAME = "spread"


class SpreadPlugin(Spread):
    """The built-in ``spread`` strategy (``Spread``); the core calls its methods itself."""

    @hookimpl
    def gpud_placement_strategies(self):
        return list(self.names)

    @hookimpl
    def gpud_node_candidates(self, strategy, request, index):
        if strategy not in self.names:
            return None
        return self.candidates(strategy, request, index)

    @hookimpl
    def gpud_gpu_order(self, strategy, request, node):
        if strategy not in self.names:
            return None
        return self.gpu_order(strategy, request, node)


PLUGIN = SpreadPlugin()
