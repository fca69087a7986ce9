"""Built-in time-slice plans: strict (each task exactly its compute request) and fair (idle time to the busy)."""

from __future__ import annotations

from gpud import hookimpl
from gpud.node.slicer import FAIR, STRICT, fair_shares, strict_shares


@hookimpl
def gpud_time_slice_plan(gpu_index, mode, holders, probe):
    """Strict and fair shares as the Run:ai time-slicing modes define them; None for any other mode."""
    if mode == STRICT:
        return strict_shares(holders)
    if mode == FAIR:
        return fair_shares(holders, probe)
    return None
