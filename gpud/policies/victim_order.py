"""Victim order: lowest priority first, then the most recently started (least work lost)."""

from gpud import hookimpl
from gpud.core.orders import NATIVE, victim_order_key


@hookimpl
def gpud_victim_order_key(victim):
    return victim_order_key(victim)


setattr(gpud_victim_order_key, NATIVE, victim_order_key)  # the core may call it directly (gpud.core.hooks.first_result)
