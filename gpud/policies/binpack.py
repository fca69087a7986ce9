"""Bin-pack placement: the fullest node and the fullest GPU that still fit the task."""

from __future__ import annotations

from gpud import hookimpl
from gpud.core.strategies import BinPack, smallest_share, unique

NAME = "binpack"

__all__ = ["NAME", "PLUGIN", "smallest_share", "unique"]


class BinPackPlugin(BinPack):
    """The built-in ``binpack`` strategy (``BinPack``); the core calls its methods itself."""

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


PLUGIN = BinPackPlugin()
