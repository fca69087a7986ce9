"""Bin-pack placement: the fullest node and the fullest GPU that still fit the task."""

from __future__ import annotations

from gpud.core.strategies import BinPack, smallest_share, unique
from gpud.policies.strategy_hooks import StrategyHooks

NAME = "binpack"

__all__ = ["NAME", "PLUGIN", "smallest_share", "unique"]


class BinPackPlugin(StrategyHooks, BinPack):
    """The built-in ``binpack`` strategy (``BinPack``); the core calls its methods itself."""


PLUGIN = BinPackPlugin()
