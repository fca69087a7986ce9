"""Time-slice plans of one shared GPU: who deserves what share, carried-over shortfalls, and interleaved leases.

Pure functions over plain values (no clock, no processes), so every rule
is tested without running anything. A plan lasts ``lease_s / precision``
seconds; each holder gets the whole GPU for leases of about ``lease_s``
and the leases of different holders are interleaved by smooth weighted
round-robin, so no holder waits a whole block of others' leases.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Iterable, Mapping, Sequence

STRICT, FAIR, OFF = "strict", "fair", "off"
MODES = (OFF, STRICT, FAIR)
EPS = 1e-9


@dataclass(frozen=True, slots=True)
class Holder:
    """One task sharing the GPU: its compute request and limit (fractions of the GPU) and what was measured.

    ``idle`` is True when the task used the GPU in none of its leases of the
    last plan; ``carry`` is what the previous plans owe it (positive) or it
    got too much (negative), as a fraction of a plan.
    """

    key: str
    request: float
    limit: float = 1.0
    project: str = ""
    idle: bool = False
    carry: float = 0.0


@dataclass(frozen=True, slots=True)
class Lease:
    """The GPU given whole to ``holder`` (None: to nobody, every holder frozen) for ``seconds``."""

    holder: str | None
    seconds: float


@dataclass(frozen=True, slots=True)
class Plan:
    """One cycle of leases and the share of the cycle each holder should get (with carry applied)."""

    leases: tuple[Lease, ...]
    targets: Mapping[str, float]
    plan_s: float


def water_fill(amount: float, caps: Mapping[str, float], weights: Mapping[str, float]) -> dict[str, float]:
    """Divide ``amount`` among the keys of ``caps`` in proportion to ``weights``, none above its cap.

    What a capped key cannot take goes to the others; what nobody can take
    is left over (the result then sums to less than ``amount``).
    """
    given = {key: 0.0 for key in caps}
    open_keys = [k for k in caps if caps[k] > EPS and weights.get(k, 1.0) > 0]
    while amount > EPS and open_keys:
        total = sum(weights.get(k, 1.0) for k in open_keys)
        step = {k: amount * weights.get(k, 1.0) / total for k in open_keys}
        full = [k for k in open_keys if step[k] >= caps[k] - given[k] - EPS]
        if not full:
            for k in open_keys:
                given[k] += step[k]
            return given
        for k in full:
            amount -= caps[k] - given[k]
            given[k] = caps[k]
        open_keys = [k for k in open_keys if k not in full]
    return given


def strict_shares(holders: Sequence[Holder]) -> dict[str, float]:
    """Strict mode: each holder gets exactly its request, measured idleness notwithstanding.

    Time nobody requested goes, equally, to holders whose limit is above
    their request (GPU-memory jobs: request 0, limit 1), up to those limits;
    the rest of the plan the GPU is left idle.
    """
    base = {h.key: min(h.request, h.limit) for h in holders}
    spare = max(0.0, 1.0 - sum(base.values()))
    extra = water_fill(spare, {h.key: h.limit - base[h.key] for h in holders}, {})
    return {key: base[key] + extra[key] for key in base}


def fair_shares(holders: Sequence[Holder], probe: float,
                weight: Callable[[Holder], float] = lambda h: 1.0) -> dict[str, float]:
    """Fair mode: each busy holder gets at least its request; time others leave goes to the busy ones.

    An idle holder keeps ``probe`` of the plan (at most its request) so that
    it is seen when it starts working again. What is left is divided among
    busy holders in proportion to ``weight`` (equally by default), up to
    their limits; only what they cannot take goes to idle holders.
    """
    base = {h.key: min(h.request, h.limit, probe) if h.idle else min(h.request, h.limit) for h in holders}
    spare = max(0.0, 1.0 - sum(base.values()))
    for group in ([h for h in holders if not h.idle], [h for h in holders if h.idle]):
        extra = water_fill(spare, {h.key: h.limit - base[h.key] for h in group}, {h.key: weight(h) for h in group})
        for key, amount in extra.items():
            base[key] += amount
            spare -= amount
    return base


def shares_for(mode: str, holders: Sequence[Holder], probe: float) -> dict[str, float]:
    """The built-in shares of ``mode`` ("strict" or "fair"); "off" gives every holder the whole GPU."""
    if mode == STRICT:
        return strict_shares(holders)
    if mode == FAIR:
        return fair_shares(holders, probe)
    return {h.key: 1.0 for h in holders}


def clean_shares(shares: Mapping[str, float], holders: Sequence[Holder]) -> dict[str, float]:
    """Shares as a plan can use them: only the holders' keys, each within [0, 1], together at most 1.

    A plan hook from a plugin may answer anything; this keeps its answer
    runnable.
    """
    keys = {h.key for h in holders}
    out = {key: max(0.0, min(1.0, float(value))) for key, value in shares.items() if key in keys}
    total = sum(out.values())
    return {key: value / total for key, value in out.items()} if total > 1.0 else out


def with_carry(shares: Mapping[str, float], holders: Sequence[Holder], max_carry: float) -> dict[str, float]:
    """Shares corrected by what earlier plans owe each holder (each carry clipped to ``max_carry``).

    A corrected share stays within [0, 1]; when the corrections would need
    more than the whole plan, every share is scaled down to fit.
    """
    carry = {h.key: max(-max_carry, min(max_carry, h.carry)) for h in holders}
    out = {key: max(0.0, min(1.0, share + carry.get(key, 0.0))) for key, share in shares.items()}
    total = sum(out.values())
    if total > 1.0:
        out = {key: value / total for key, value in out.items()}
    return out


def interleave(counts: Mapping[str | None, int]) -> list[str | None]:
    """Smooth weighted round-robin: each key ``counts[key]`` times, spread as evenly as the counts allow.

    Ties go to the key listed first, so the order is deterministic.
    """
    keys = [k for k, n in counts.items() if n > 0]
    total = sum(counts[k] for k in keys)
    current = {k: 0 for k in keys}
    order = []
    for _ in range(total):
        for k in keys:
            current[k] += counts[k]
        best = max(keys, key=lambda k: current[k])
        current[best] -= total
        order.append(best)
    return order


def build_plan(targets: Mapping[str, float], lease_s: float, precision: float) -> Plan:
    """Leases for one plan of ``lease_s / precision`` seconds giving each key its target share.

    Each key's time is cut into about ``share / precision`` equal leases
    (at least one), so a lease is close to ``lease_s``; time no key gets is
    an idle lease (holder None), unless it is too short to matter, when the
    plan is just that much shorter. A single key owning the whole plan gets
    one lease of the whole plan: it is never frozen.
    """
    plan_s = lease_s / precision
    seconds: dict[str | None, float] = {key: share * plan_s for key, share in targets.items()
                                        if share * plan_s > EPS}
    idle = plan_s - sum(seconds.values())
    if idle > lease_s * 0.05:
        seconds[None] = idle
    if len(seconds) == 1:
        (key,) = seconds
        return Plan((Lease(key, seconds[key]),), dict(targets), plan_s)
    counts = {key: max(1, round(s / lease_s)) for key, s in seconds.items()}
    remaining = dict(counts)
    leases = []
    for key in interleave(counts):
        leases.append(Lease(key, seconds[key] / counts[key]))
        remaining[key] -= 1
    return Plan(tuple(leases), dict(targets), plan_s)


def next_carry(plan: Plan, delivered: Mapping[str, float], holders: Iterable[Holder],
               max_carry: float) -> dict[str, float]:
    """What each holder is owed after ``plan``: its target share minus the share it got, clipped to ``max_carry``.

    ``delivered`` is what each holder got in any unit (seconds of the GPU,
    run time); it is scaled so that the busy holders together got what they
    were meant to get together, so a loss every holder suffers alike (switch
    overhead, a slower clock) is nobody's debt. Idle holders are owed
    nothing (they did not want the time); holders missing from the plan
    start afresh.
    """
    holders = list(holders)
    busy = [h.key for h in holders if not h.idle and plan.targets.get(h.key, 0.0) > 0]
    got = sum(delivered.get(key, 0.0) for key in busy)
    meant = sum(plan.targets[key] for key in busy)
    scale = meant / got if got > 0 else 0.0
    out = {}
    for h in holders:
        if h.key not in busy:
            out[h.key] = 0.0
            continue
        owed = plan.targets[h.key] - delivered.get(h.key, 0.0) * scale
        out[h.key] = max(-max_carry, min(max_carry, owed))
    return out
