"""Fair time-slicing weighted by project: the spare time of a shared GPU goes to projects by weight.

In gpud's fair mode each task first gets its compute request; the time
left (unrequested, or left by idle tasks) is divided equally. With this
plugin it is divided in proportion to a weight per project, read once
from the node daemon's environment:

    GPUD_PROJECT_SLICE_WEIGHTS="research=3,teaching=1"

Projects not named weigh 1. Strict mode is left alone (each task gets
exactly its request there), and so is fair mode when no weight is set.
"""

from __future__ import annotations

import os
from typing import Mapping

from gpud import hookimpl
from gpud.node.slicer import FAIR, fair_shares

WEIGHTS_ENV = "GPUD_PROJECT_SLICE_WEIGHTS"


def parse_weights(text: str) -> dict[str, float]:
    """Project weights from "name=weight,name=weight"; a malformed entry is a ValueError naming it."""
    weights = {}
    for item in filter(None, (part.strip() for part in text.split(","))):
        name, sep, value = item.partition("=")
        try:
            weight = float(value)
        except ValueError:
            weight = -1.0
        if not sep or not name.strip() or weight < 0:
            raise ValueError(f"{WEIGHTS_ENV}: {item!r} is not project=weight with a weight >= 0")
        weights[name.strip()] = weight
    return weights


WEIGHTS: Mapping[str, float] = parse_weights(os.environ.get(WEIGHTS_ENV, ""))


def weighted_shares(holders, probe: float, weights: Mapping[str, float]) -> dict[str, float]:
    """Fair shares whose spare time follows ``weights`` by each holder's project."""
    return fair_shares(holders, probe, weight=lambda h: weights.get(h.project, 1.0))


@hookimpl
def gpud_time_slice_plan(gpu_index, mode, holders, probe):
    """Weighted fair shares in fair mode when weights are set; otherwise leave the plan to gpud."""
    if mode != FAIR or not WEIGHTS:
        return None
    return weighted_shares(holders, probe, WEIGHTS)
