"""Victim order: lowest priority first, then the most recently started (least work lost)."""

from gpud import hookimpl
from gpud.core.orders import PriorityVictimOrder


class VictimOrderPlugin(PriorityVictimOrder):
    """The built-in victim order (``PriorityVictimOrder``); the core calls its ``key`` itself."""

    @hookimpl
    def gpud_victim_order_key(self, victim):
        return self.key(victim)


PLUGIN = VictimOrderPlugin()
