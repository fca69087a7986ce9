"""Past usage in the fair share: decayed GPU-seconds scale each queue's over-quota weight."""

from __future__ import annotations

from typing import Final, Mapping, Sequence

from gpud.model import EPS

# The least a queue's weight is scaled to: a queue that used everything still gets what no one else can use.
FLOOR: Final = 0.01


def history_factors(weights: Sequence[float], usages: Sequence[float], strength: float) -> list[float] | None:
    """The factor each member's over-quota weight is multiplied by, or None to leave the weights alone.

    With s the member's share of the weights and u its share of the usage
    (both among members of positive weight), the factor is
    max(FLOOR, 1 + strength * (s - u)): a queue that used more than its
    weight's share gets less of the surplus, one that used less gets more.
    None when the strength is 0 or no member of positive weight used anything.
    """
    if strength <= 0:
        return None
    total_weight = 0.0
    total_usage = 0.0
    for weight, used in zip(weights, usages):
        if weight > 0:
            total_weight += weight
            total_usage += used
    if total_weight <= EPS or total_usage <= EPS:
        return None
    factors = []
    for weight, used in zip(weights, usages):
        if weight <= 0:
            factors.append(1.0)
            continue
        factor = 1.0 + strength * (weight / total_weight - used / total_usage)
        factors.append(factor if factor > FLOOR else FLOOR)
    return factors


def entry_penalty(gpus: float, started: float | None, now: float, window: float) -> float:
    """GPU-seconds a running job counts for beyond its charged usage: ``gpus`` times what is left of
    ``window`` since it started, so charged usage plus penalty stays ``gpus * window`` until the
    charging catches up."""
    if started is None or window <= 0:
        return 0.0
    left = window - (now - started)
    return gpus * left if left > 0 else 0.0


def usage_of(usage: Mapping[tuple[str, str, str], float], level: str, pool: str, name: str) -> float:
    """The decayed GPU-seconds of one department, project or user ("<project>/<user>") in one pool."""
    return usage.get((level, pool, name), 0.0)
