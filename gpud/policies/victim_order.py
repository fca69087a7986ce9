"""Victim order: lowest priority first, then the fewest GPU-seconds since the last checkpoint."""

from gpud import hookimpl
from gpud.core.orders import LeastLostWorkVictimOrder


class VictimOrderPlugin(LeastLostWorkVictimOrder):
    """The built-in victim order (``LeastLostWorkVictimOrder``); the core calls its ``key`` itself.

    With the policy's ``victim_order = "youngest_first"`` the core calls the
    youngest-first order (``PriorityVictimOrder``) in its place.
    """

    @hookimpl
    def gpud_victim_order_key(self, victim):
        return self.key(victim)


PLUGIN = VictimOrderPlugin()
