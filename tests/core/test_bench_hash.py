"""bench/scheduler_cycle.py --hash hashes the decisions themselves, however the numbers were spelled.

Fields declared ``float`` in gpud.model hold an int a caller gave (``Resources(gpu=8)``,
``TaskRequest(1, cpus=6)``) in the Python core, but always a float in the compiled one: the same
decision printed ``level=11`` in one and ``level=11.0`` in the other, so the two builds' hashes
differed though every bind, eviction, reason and planned start was equal. The hash is what shows the
compiled core decides as the Python one does; it must not depend on that spelling.
"""

from __future__ import annotations

import dataclasses
import importlib.util
from pathlib import Path

import pytest

from gpud.core import schedule
from gpud.model import Resources, Snapshot
from gpud.plugins import make_plugin_manager
from gpud.policy import Policy

_spec = importlib.util.spec_from_file_location(
    "scheduler_cycle", Path(__file__).resolve().parents[2] / "bench" / "scheduler_cycle.py")
assert _spec is not None and _spec.loader is not None
bench = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(bench)


def _floats(amount: Resources) -> Resources:
    return Resources(float(amount.gpu), float(amount.cpu), float(amount.memory))


def spelled_as_floats(snapshot: Snapshot, policy: Policy) -> tuple[Snapshot, Policy]:
    """The same cluster and policy with every amount given as a float (8.0 where the bench gave 8)."""
    nodes = tuple(dataclasses.replace(n, gpu_memory_gib=float(n.gpu_memory_gib), cpus=float(n.cpus),
                                      memory_gib=float(n.memory_gib)) for n in snapshot.nodes)
    jobs = tuple(dataclasses.replace(j, request=dataclasses.replace(
        j.request, gpus=float(j.request.gpus), cpus=float(j.request.cpus),
        memory_gib=float(j.request.memory_gib))) for j in snapshot.jobs)
    projects = {name: dataclasses.replace(p, quota={pool: _floats(q) for pool, q in p.quota.items()})
                for name, p in policy.projects.items()}
    departments = {name: dataclasses.replace(d, quota={pool: _floats(q) for pool, q in d.quota.items()})
                   for name, d in policy.departments.items()}
    return (dataclasses.replace(snapshot, nodes=nodes, jobs=jobs),
            dataclasses.replace(policy, projects=projects, departments=departments))


@pytest.mark.parametrize("time_limits", [False, True])
def test_the_same_decisions_hash_alike_whether_amounts_are_ints_or_floats(monkeypatch, time_limits: bool) -> None:
    monkeypatch.setattr(bench, "TIME_LIMITS", time_limits)
    snapshot, policy = bench.big_cluster(1, 20, 120, 600)  # int quotas and requests, as the bench gives them
    pm = make_plugin_manager()
    plan = schedule(snapshot, policy, pm)
    again = schedule(*spelled_as_floats(snapshot, policy), pm)
    # The case decides something of every kind the hash covers: binds, reclaims naming the quota or fair
    # share they compare against, reasons, and with time limits planned starts.
    assert plan.binds and plan.pending
    assert any(e.why is not None and e.why.over for e in plan.evictions)
    assert bool(plan.reservations) == time_limits
    assert (plan.binds, plan.evictions) == (again.binds, again.evictions)
    assert bench.decisions_digest(plan) == bench.decisions_digest(again)
    assert bench.plan_digest(plan) == bench.plan_digest(again)
    # ... and a different decision hashes differently.
    fewer = dataclasses.replace(plan, binds=plan.binds[:-1])
    assert bench.decisions_digest(fewer) != bench.decisions_digest(plan)
    assert bench.plan_digest(fewer) != bench.plan_digest(plan)
