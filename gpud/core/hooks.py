"""What the core asks of the plugin manager about its hooks, apart from calling them."""

from __future__ import annotations

from typing import Any

TRACING = "gpud_tracing"  # set on a plugin manager whose hook calls are traced: every call goes through pluggy


def traced(pm: Any) -> bool:
    """True when ``pm``'s hook calls are traced (gpud.plugins, GPUD_TRACE_HOOKS): every hook is then to
    be called through pluggy, for the trace to see it."""
    return bool(getattr(pm, TRACING, False))


def has_implementations(caller: Any) -> bool:
    """True when some registered plugin implements the hook."""
    return bool(caller.get_hookimpls())
