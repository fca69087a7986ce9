"""Fair share by water-filling: quota first, then the surplus by over-quota priority and weight."""

from __future__ import annotations

from typing import Final, Sequence

from gpud.model import EPS

INF: Final = float("inf")


class Claim:
    """What one queue brings to the division of one resource at one level of the hierarchy.

    ``cap`` is the most it may receive: its demand, bounded by its limit (and
    by its quota when it may not go over quota). A plain class, not a
    dataclass: the compiled core makes hundreds per cycle, and a dataclass's
    generated constructor runs interpreted.
    """

    __slots__ = ("quota", "weight", "priority", "cap")

    def __init__(self, quota: float, weight: float, priority: int, cap: float) -> None:
        self.quota = quota
        self.weight = weight
        self.priority = priority
        self.cap = cap

    def __repr__(self) -> str:
        return f"Claim(quota={self.quota}, weight={self.weight}, priority={self.priority}, cap={self.cap})"


def water_fill(amount: float, weights: Sequence[float], caps: Sequence[float]) -> list[float]:
    """Divide ``amount`` in proportion to ``weights``, giving no one more than its cap.

    What a capped entry cannot take goes to the others, in proportion to
    their weights; entries of weight 0 receive nothing. The result never
    sums to more than ``amount``.
    """
    given = [0.0] * len(weights)
    active = [i for i, w in enumerate(weights) if w > 0 and caps[i] > EPS]
    remaining = amount
    while active and remaining > EPS:
        total = sum(weights[i] for i in active)
        saturated = [i for i in active if caps[i] - given[i] <= remaining * weights[i] / total + EPS]
        if not saturated:
            for i in active:
                given[i] += remaining * weights[i] / total
            return given
        for i in saturated:
            remaining -= caps[i] - given[i]
            given[i] = caps[i]
        active = [i for i in active if i not in saturated]
    return given


def divide(capacity: float, claims: Sequence[Claim], scale_quotas: bool, pool: float = INF) -> list[float]:
    """Each claim's fair share of ``capacity``: its deserved quota plus its part of the surplus.

    Deserved quota is min(quota, cap). At the top of the hierarchy
    (``scale_quotas`` false) quotas are honoured even when they add up to
    more than the capacity, and then no surplus is left. Inside a department
    (``scale_quotas`` true) deserved quotas that add up to more than the
    department's share divide that share in proportion to quota. The surplus
    goes to the highest over-quota priority first, then by weight, each
    queue capped at what it may receive. The surplus is never more than
    ``pool`` (the whole pool) leaves after the deserved quotas: a department
    whose quota exceeds the pool deserves it, but its projects share out only
    GPUs that exist.
    """
    deserved = [min(c.quota, c.cap) for c in claims]
    if scale_quotas and sum(deserved) > capacity + EPS:
        deserved = water_fill(capacity, [c.quota for c in claims], deserved)
    shares = list(deserved)
    surplus = min(capacity, pool) - sum(deserved)
    for priority in sorted({c.priority for c in claims}, reverse=True):
        if surplus <= EPS:
            break
        members = [i for i, c in enumerate(claims) if c.priority == priority]
        extra = water_fill(surplus, [claims[i].weight for i in members],
                           [claims[i].cap - deserved[i] for i in members])
        for i, amount in zip(members, extra):
            shares[i] += amount
            surplus -= amount
    return shares
