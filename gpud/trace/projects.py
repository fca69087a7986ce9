"""Synthetic projects for a trace without tenants: real per-team GPU quotas from the Helios clusters,
and a seeded assignment of pods to them."""

from __future__ import annotations

import bisect
import csv
import hashlib
from dataclasses import dataclass
from typing import Sequence

from gpud.model import Resources
from gpud.policy import Department, Policy, Project


@dataclass(frozen=True, slots=True)
class QuotaTable:
    """Projects (Helios virtual clusters) and their share of the cluster's GPUs on one day."""

    source: str
    day: str
    shares: tuple[tuple[str, float], ...]


def read_helios_quotas(path: str, day: str | None = None) -> QuotaTable:
    """The VCs with a non-zero quota on ``day`` (default: the file's last day), as shares of ``total``."""
    with open(path, newline="") as handle:
        rows = list(csv.DictReader(handle))
    if not rows:
        raise ValueError(f"{path}: no rows")
    row = rows[-1] if day is None else next((r for r in rows if r["date"] == day), None)
    if row is None:
        raise ValueError(f"{path}: no day {day}")
    total = float(row["total"])
    shares = tuple((name, int(value) / total) for name, value in row.items()
                   if name not in ("date", "total") and int(value) > 0)
    return QuotaTable(path, row["date"], shares)


def project_of(pod_name: str, table: QuotaTable, seed: int) -> str:
    """The project a pod belongs to: drawn with probability proportional to quota, from a hash of
    the seed and the pod's name (so the same pod always lands in the same project for a seed)."""
    digest = hashlib.sha256(f"{seed}:{pod_name}".encode()).digest()
    u = int.from_bytes(digest[:8], "big") / 2.0 ** 64
    cumulative, acc = [], 0.0
    for _, share in table.shares:
        acc += share
        cumulative.append(acc)
    i = min(bisect.bisect_right(cumulative, u * acc), len(cumulative) - 1)
    return table.shares[i][0]


def trace_policy(table: QuotaTable, capacity_gpus: float, placement: str, pool: str = "default",
                 cpu_placement: str | None = None) -> Policy:
    """A policy with one project per VC, its GPU quota its share of ``capacity_gpus``, over-quota
    weight proportional to quota (the Helios README's suggestion), all in one implicit department."""
    projects = {name: Project(name, quota={pool: Resources(gpu=share * capacity_gpus)},
                              over_quota_weight=share * 100)
                for name, share in table.shares}
    return Policy(departments={"default": Department("default", implicit=True)}, projects=projects,
                  default_pool=pool, placement=placement, cpu_placement=cpu_placement or placement)


def names(table: QuotaTable) -> Sequence[str]:
    """The projects of a quota table, in file order."""
    return [name for name, _ in table.shares]
