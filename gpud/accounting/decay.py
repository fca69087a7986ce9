"""The pure arithmetic of decayed usage: no clock, no I/O.

Usage is kept as amounts decayed to one instant (``as_of``). Moving to a
later instant multiplies every amount by ``0.5 ** (elapsed / half_life)``;
a reset period (as Slurm's PriorityUsageResetPeriod) zeroes everything
once a period boundary has passed. Because decay is a multiplication, it
commutes with charging: charging ``c`` then decaying equals decaying, then
charging ``c`` decayed the same way.
"""

from __future__ import annotations

import calendar
import math
import time
from typing import Iterable, Mapping

LEVELS = ("department", "project", "user")
RESETS = ("none", "daily", "weekly", "monthly")
# (level, pool, name): a user's name is "<project>/<user>", its usage in that project only.
UsageKey = tuple[str, str, str]
# GPU-seconds, CPU-seconds, memory GiB-seconds.
Amount = tuple[float, float, float]
ZERO: Amount = (0.0, 0.0, 0.0)
FORGET_BELOW = 1e-6  # an amount decayed below this in every resource is dropped, keeping the table small


def decay_factor(elapsed_s: float, half_life_s: float) -> float:
    """What one unit of usage is worth ``elapsed_s`` later: 0.5 per half-life; 1.0 when the half-life is 0
    (no decay) or no time passed."""
    if half_life_s <= 0 or elapsed_s <= 0 or math.isinf(half_life_s):
        return 1.0
    return 0.5 ** (elapsed_s / half_life_s)


def last_reset(period: str, now: float) -> float | None:
    """The most recent reset boundary at or before ``now`` (UTC midnight; Monday for weekly; the 1st for
    monthly), or None when ``period`` is "none"."""
    if period == "none":
        return None
    day = time.gmtime(now)
    midnight = calendar.timegm((day.tm_year, day.tm_mon, day.tm_mday, 0, 0, 0))
    if period == "daily":
        return float(midnight)
    if period == "weekly":
        return float(midnight - day.tm_wday * 86400)
    if period == "monthly":
        return float(calendar.timegm((day.tm_year, day.tm_mon, 1, 0, 0, 0)))
    raise ValueError(f"unknown reset period {period!r}: expected one of {', '.join(RESETS)}")


def scaled(amount: Amount, factor: float) -> Amount:
    """``amount`` multiplied by ``factor`` in every resource."""
    return (amount[0] * factor, amount[1] * factor, amount[2] * factor)


def added(a: Amount, b: Amount) -> Amount:
    """The sum of two amounts."""
    return (a[0] + b[0], a[1] + b[1], a[2] + b[2])


def decayed(rows: Mapping[UsageKey, Amount], as_of: float, now: float, half_life_s: float,
            reset: str = "none") -> dict[UsageKey, Amount]:
    """``rows`` (amounts as of ``as_of``) as of ``now``: decayed, or empty when a reset boundary lies in
    (as_of, now]. Amounts that decayed to almost nothing are dropped; ``now`` before ``as_of`` changes nothing."""
    boundary = last_reset(reset, now)
    if boundary is not None and as_of < boundary <= now:
        return {}
    factor = decay_factor(now - as_of, half_life_s)
    out: dict[UsageKey, Amount] = {}
    for key, amount in rows.items():
        value = scaled(amount, factor)
        if max(value) >= FORGET_BELOW:
            out[key] = value
    return out


def charged(rows: Mapping[UsageKey, Amount], charges: Iterable[tuple[UsageKey, Amount]]) -> dict[UsageKey, Amount]:
    """``rows`` with every charge added to its key."""
    out = dict(rows)
    for key, amount in charges:
        out[key] = added(out.get(key, ZERO), amount)
    return out


def gpu_seconds(rows: Mapping[UsageKey, Amount]) -> dict[UsageKey, float]:
    """The GPU-seconds of each key."""
    return {key: amount[0] for key, amount in rows.items()}
