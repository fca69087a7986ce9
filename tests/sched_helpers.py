"""Shared helpers for the scheduling tests: run an inline TOML scenario and read what the cycles did."""

from __future__ import annotations

import textwrap
import tomllib

from gpud.model import Eviction
from gpud.plugins import make_plugin_manager
from gpud.scenario import Scenario, parse_scenario
from gpud.simulate import Simulation, simulate
from gpud.reasons import pending_texts


def scenario(text: str, source: str = "<inline>") -> Scenario:
    """A Scenario from TOML text written in a test (indentation is ignored)."""
    return parse_scenario(tomllib.loads(textwrap.dedent(text)), source)


def run(text: str) -> Simulation:
    """Simulate an inline scenario with a fresh plugin manager, failing the test if its [expect] fails."""
    sc = scenario(text)
    sim = simulate(sc, make_plugin_manager(sc.policy.plugins.disable, sc.policy.plugins.directory))
    assert not sim.failures, "\n".join(sim.failures)
    return sim


def queue(sim: Simulation, name: str, pool: str = "default", kind: str = "project"):
    """The QueueReport of one queue in the last cycle."""
    found = [q for q in sim.last_plan.queues if q.name == name and q.pool == pool and q.kind == kind]
    assert found, f"no {kind} {name} in pool {pool}"
    return found[0]


def fair_share(sim: Simulation, name: str, pool: str = "default", kind: str = "project") -> float:
    """A queue's GPU fair share in the last cycle."""
    return queue(sim, name, pool, kind).fair_share.gpu


def gpus(sim: Simulation, name: str, pool: str = "default", kind: str = "project") -> float:
    """GPUs a queue holds after the last cycle."""
    return queue(sim, name, pool, kind).allocated.gpu


def job(sim: Simulation, job_id: str):
    """A job as it stands after the last cycle."""
    return next(j for j in sim.snapshot.jobs if j.id == job_id)


def nodes_of(sim: Simulation, job_id: str) -> list[str]:
    """The node of each task of a job after the last cycle ("" for a pending task)."""
    j = job(sim, job_id)
    return [p.node if p else "" for p in (j.task_placement(i) for i in range(j.tasks))]


def gpu_index(sim: Simulation, job_id: str) -> list[tuple[int, ...]]:
    """The GPU indices of each task of a job after the last cycle."""
    j = job(sim, job_id)
    return [tuple(p.gpu_index) if p else () for p in (j.task_placement(i) for i in range(j.tasks))]


def reason(sim: Simulation, job_id: str) -> str:
    """Why a pending job waits, as the last cycle said."""
    reasons = pending_texts(sim.last_plan)
    assert job_id in reasons, f"{job_id} has no pending reason (running: {sorted(sim.running())})"
    return reasons[job_id]


def evictions(sim: Simulation, rule: str | None = None) -> list[Eviction]:
    """Every eviction or move the cycles made, optionally only those of one rule."""
    return [e for _, e in sim.evictions if rule is None or e.rule == rule]


def evicted_jobs(sim: Simulation, rule: str | None = None) -> set[str]:
    """The ids of jobs that lost tasks (stopped or moved), optionally by one rule."""
    return {e.job for e in evictions(sim, rule)}
