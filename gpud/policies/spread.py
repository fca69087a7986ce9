"""Spread placement: the emptiest node and the emptiest GPU, to leave the most room per task."""

from __future__ import annotations

from gpud.core.strategies import Spread
from gpud.policies.strategy_hooks import StrategyHooks

NAME = "spread"


class SpreadPlugin(StrategyHooks, Spread):
    """The built-in ``spread`` strategy (``Spread``); the core calls its methods itself."""


PLUGIN = SpreadPlugin()
