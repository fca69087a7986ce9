"""``gpuctl usage`` rows: each department, project and user with its quota, fair share, decayed usage and
standing.

Standing = entitlement share ÷ usage share, among siblings (departments of a
pool; projects of one department in a pool; users of one project in a
pool). A queue's entitlement is its GPU quota in the pool (its over-quota
weight when no sibling has a quota); users of a project are entitled
equally. Above 1: it used less than it is entitled to; below 1: more. None
(no usage) means it used nothing.
"""

from __future__ import annotations

from typing import Mapping

from gpud.accounting.decay import Amount, UsageKey
from gpud.policy import Policy

HOUR = 3600.0


def usage_rows(policy: Policy, amounts: Mapping[UsageKey, Amount], fair_shares: Mapping[tuple[str, str, str], float],
               pools: set[str]) -> list[dict]:
    """A row per (level, pool, queue or user), departments first, each followed by its projects and their users.

    ``fair_shares`` maps (kind, pool, name) of the plan's queue reports to their
    GPU fair share; ``pools`` are the pools to show besides those with usage.
    """
    pools = set(pools) | {key[1] for key in amounts}
    rows: list[dict] = []
    for pool in sorted(pools):
        departments = sorted({p.department for p in policy.projects.values()}
                             | {name for level, p, name in amounts if level == "department" and p == pool})
        dept_weights = {d: _weight(policy, "department", d, pool) for d in departments}
        dept_usage = {d: _gpu(amounts, ("department", pool, d)) for d in departments}
        for dept in departments:
            rows.append(_row(policy, "department", pool, dept, dept, None, None, amounts, fair_shares,
                             dept_weights, dept_usage))
            projects = sorted({name for name, p in policy.projects.items() if p.department == dept}
                              | {name for level, p, name in amounts if level == "project" and p == pool
                                 and _department(policy, name) == dept})
            weights = {p: _weight(policy, "project", p, pool) for p in projects}
            usage = {p: _gpu(amounts, ("project", pool, p)) for p in projects}
            for project in projects:
                rows.append(_row(policy, "project", pool, project, dept, project, None, amounts, fair_shares,
                                 weights, usage))
                users = sorted({name.partition("/")[2] for level, p, name in amounts
                                if level == "user" and p == pool and name.partition("/")[0] == project})
                user_usage = {u: _gpu(amounts, ("user", pool, f"{project}/{u}")) for u in users}
                for user in users:
                    rows.append(_row(policy, "user", pool, f"{project}/{user}", dept, project, user, amounts,
                                     fair_shares, {u: 1.0 for u in users}, user_usage))
    return rows


def _department(policy: Policy, project: str) -> str:
    found = policy.projects.get(project)
    return found.department if found is not None else "default"


def _gpu(amounts: Mapping[UsageKey, Amount], key: UsageKey) -> float:
    found = amounts.get(key)
    return found[0] if found is not None else 0.0


def _weight(policy: Policy, kind: str, name: str, pool: str) -> float:
    settings = (policy.departments if kind == "department" else policy.projects).get(name)
    if settings is None:
        return 0.0
    return settings.quota_in(pool).gpu


def _row(policy: Policy, level: str, pool: str, name: str, department: str, project: str | None, user: str | None,
         amounts: Mapping[UsageKey, Amount], fair_shares: Mapping[tuple[str, str, str], float],
         weights: Mapping[str, float], usage: Mapping[str, float]) -> dict:
    key = name if level != "user" else user or ""  # no user: no weight, no usage
    if not any(weights.values()):  # nobody has a quota here: over-quota weights, else equal shares
        weights = {k: _over_quota_weight(policy, level, k) for k in weights}
    total_weight, total_usage = sum(weights.values()), sum(usage.values())
    entitled = weights.get(key, 0.0) / total_weight if total_weight > 0 else 0.0
    used = usage.get(key, 0.0) / total_usage if total_usage > 0 else 0.0
    gpu_s, cpu_s, memory_s = amounts.get((level, pool, name), (0.0, 0.0, 0.0))
    settings = (policy.departments if level == "department" else policy.projects).get(name) \
        if level != "user" else None
    return {"level": level, "pool": pool, "name": name, "department": department, "project": project, "user": user,
            "quota": None if settings is None else settings.quota_in(pool).gpu,
            "fair_share": fair_shares.get((level, pool, name)),
            "gpu_hours": gpu_s / HOUR, "cpu_hours": cpu_s / HOUR, "memory_gib_hours": memory_s / HOUR,
            "entitlement_share": entitled, "usage_share": used,
            "standing": (entitled / used) if used > 0 else None}


def _over_quota_weight(policy: Policy, level: str, name: str) -> float:
    if level == "user":
        return 1.0
    settings = (policy.departments if level == "department" else policy.projects).get(name)
    return settings.over_quota_weight if settings is not None else 0.0
