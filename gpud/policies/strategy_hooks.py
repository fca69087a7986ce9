"""The placement hooks of a strategy plugin built on the core's ``Strategy`` class."""

from __future__ import annotations

from gpud import hookimpl


class StrategyHooks:
    """Mixed into a ``Strategy`` subclass (gpud.core.strategies), answers the placement hooks for its
    own strategy names with its methods: the core calls those methods directly, and these hooks
    serve whoever asks through the plugin manager (a plugin wrapping the strategy, say)."""

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
