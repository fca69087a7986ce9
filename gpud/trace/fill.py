"""Fill mode, the FGD paper's method: pods arrive in a seeded random order, never finish, and are
placed one by one by gpud's real placement code until the requests reach a target share of capacity."""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Sequence

import pluggy

from gpud.core.placement import Placer
from gpud.core.state import ClusterState, Statement
from gpud.model import NodeSpec, Snapshot
from gpud.policy import Department, Policy, Project
from gpud.trace.alibaba import TracePod, pod_job, total_gpus

LEVELS = (50, 80, 90, 100, 110, 120, 130)
SEEDS = tuple(range(42, 52))
PROJECT = "trace"


@dataclass
class FillResult:
    """One fill run: allocation at each arrived-load level (percent of GPU capacity)."""

    strategy: str
    seed: int
    capacity: int
    arrived_pods: int = 0
    placed_pods: int = 0
    failed_pods: int = 0
    alloc_pct: dict[int, float] = field(default_factory=dict)
    unallocated_gpus: dict[int, float] = field(default_factory=dict)
    curve: list[tuple[float, float]] = field(default_factory=list)


def inflate(pods: Sequence[TracePod], capacity_gpus: int, ratio: float, rng: random.Random) -> list[TracePod]:
    """The pods plus copies drawn at random (with replacement) while the GPU requests stay within
    ``ratio`` x capacity, then shuffled; with too many requests, random pods are dropped instead.

    This is the workload "tuning" of the FGD artifact (its TunePodsByNodeTotalResource), with
    Python's generator in place of Go's, so orders differ from the paper's but not their law.
    """
    target = ratio * capacity_gpus * 1000
    out = list(pods)
    total = sum(p.gpu_milli_total for p in out)
    while total > target and out:
        total -= out.pop(rng.randrange(len(out))).gpu_milli_total
    while True:
        pod = pods[rng.randrange(len(pods))]
        if total + pod.gpu_milli_total > target:
            break
        out.append(pod)
        total += pod.gpu_milli_total
    rng.shuffle(out)
    return out


def fill_policy(strategy: str) -> Policy:
    """One project with no quota in one pool that places GPU and CPU-only tasks with ``strategy``."""
    return Policy(departments={"default": Department("default", implicit=True)}, projects={PROJECT: Project(PROJECT)},
                  placement=strategy, cpu_placement=strategy)


def run_fill(pods: Sequence[TracePod], nodes: Sequence[NodeSpec], strategy: str, seed: int,
             pm: pluggy.PluginManager, ratio: float = 1.3, levels: Sequence[int] = LEVELS,
             curve_step: float = 0.01) -> FillResult:
    """Place the inflated, shuffled workload pod by pod with the placement strategy ``strategy``.

    Each pod goes through gpud's Placer (the pool's placement plugins, node
    and GPU checks) and is bound through a Statement on a ClusterState, as in
    a scheduling cycle; a pod that does not fit is dropped, as in the paper.
    Allocation is recorded the first time arrived requests reach each level
    (percent of GPU capacity), and at the end for the last level.
    """
    capacity = total_gpus(nodes)
    state = ClusterState(Snapshot(tuple(nodes), (), 0.0), fill_policy(strategy), pm)
    placer = Placer(state)
    stmt = Statement(state)
    index = state.indexes[state.policy.default_pool]
    result = FillResult(strategy, seed, capacity)
    workload = inflate(pods, capacity, ratio, random.Random(seed))
    pending_levels = sorted(levels)
    arrived = 0
    next_point = 0.0
    for seq, pod in enumerate(workload):
        arrived += pod.gpu_milli_total
        placement, job = None, None
        for model in pod.gpu_spec if len(pod.gpu_spec) > 1 else (None,):
            job = pod_job(pod, f"p{seq}", PROJECT, 0.0, seq, priority=50, model=model)
            # Registered by hand rather than through add_job: fill mode has no backlog to keep.
            state.jobs[job.id] = job
            state.placements[job.id] = [None]
            placement = placer.find(job)
            if placement is not None:
                break
            del state.jobs[job.id], state.placements[job.id]
            state.shapes.forget(job.id)  # the next model's job takes the same id with another selector
        if placement is not None and job is not None:  # a placement is found for a job
            stmt.bind(job, 0, placement)
            result.placed_pods += 1
        else:
            result.failed_pods += 1
        allocated = capacity - index.free_gpu
        load = arrived / 1000 / capacity
        if load >= next_point:
            result.curve.append((round(100 * load, 3), round(100 * allocated / capacity, 3)))
            next_point = load + curve_step
        while pending_levels and 100 * load >= pending_levels[0] - 1e-9:
            level = pending_levels.pop(0)
            result.alloc_pct[level] = 100 * allocated / capacity
            result.unallocated_gpus[level] = capacity - allocated
    allocated = capacity - index.free_gpu
    for level in pending_levels:
        result.alloc_pct[level] = 100 * allocated / capacity
        result.unallocated_gpus[level] = capacity - allocated
    result.arrived_pods = len(workload)
    return result
