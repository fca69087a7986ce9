"""What the core asks of the plugin manager about its hooks, apart from calling them."""

from __future__ import annotations

from typing import Any


def traced(pm: Any) -> bool:
    """True when ``pm``'s hook calls are monitored (``gpud.plugins.PluginManager.monitored``: hook
    tracing, GPUD_TRACE_HOOKS): every hook is then to be called through pluggy, for the monitor to see it."""
    return bool(getattr(pm, "monitored", False))


def has_implementations(caller: Any) -> bool:
    """True when some registered plugin implements the hook."""
    return bool(caller.get_hookimpls())
