"""Time replay of a trace through the warm scheduling core: arrivals, finishes, evictions and requeues
in simulated time, with the figures an operator asks about (utilisation, waits, fairness)."""

from __future__ import annotations

import heapq
import math
import statistics
from dataclasses import dataclass, field
from typing import Sequence

import pluggy

from gpud.core import Scheduler
from gpud.model import NodeSpec, Plan, Snapshot
from gpud.policy import Policy
from gpud.trace.alibaba import TracePod, pod_job

FINISH, ARRIVE = 0, 1
SAMPLE_EVERY_S = 3600.0
RECENT_S = 30 * 86400.0


@dataclass
class _Job:
    pod: TracePod
    project: str
    submitted: float
    duration: float
    started: float | None = None
    finished: float | None = None
    running: bool = False
    epoch: int = 0
    starts: int = 0


@dataclass
class ReplayResult:
    """What a replay measured; times in seconds of trace time, GPUs as fractions of capacity in %."""

    capacity_gpus: float
    jobs: int = 0
    cycles: int = 0
    started: int = 0
    finished: int = 0
    never_started: int = 0
    evictions: int = 0
    moves: int = 0
    utilisation_pct: float = 0.0
    utilisation_recent_pct: float = 0.0
    wait_s: dict[str, float] = field(default_factory=dict)
    jct_s: dict[str, float] = field(default_factory=dict)
    production_wait_s: dict[str, float] = field(default_factory=dict)
    fairness: dict[str, dict[str, float]] = field(default_factory=dict)
    series: list[tuple[float, float]] = field(default_factory=list)
    shares: dict[str, list[tuple[float, float, float]]] = field(default_factory=dict)


def summary(values: Sequence[float]) -> dict[str, float]:
    """Mean, median and 99th percentile (nearest rank) of ``values``; zeros when there are none."""
    if not values:
        return {"mean": 0.0, "median": 0.0, "p99": 0.0, "count": 0}
    ordered = sorted(values)
    p99 = ordered[max(0, math.ceil(round(0.99 * len(ordered), 9)) - 1)]
    return {"mean": statistics.fmean(ordered), "median": statistics.median(ordered), "p99": p99,
            "count": len(ordered)}


def replay(pods: Sequence[TracePod], nodes: Sequence[NodeSpec], policy: Policy, pm: pluggy.PluginManager,
           project_of, capacity_gpus: float | None = None) -> ReplayResult:
    """Replay the pods that ran in production (those with a start time) on ``nodes`` in trace time.

    Each pod arrives at its creation time as a one-task job of
    ``project_of(pod)`` and runs for its production run time once placed.
    After the events of each instant (finishes before arrivals) the scheduler
    runs one cycle and its plan is carried out: binds start jobs, evictions
    stop them and they wait again, to run their whole time over when placed
    again (no checkpoints are assumed). A moved job restarts too.
    """
    capacity = capacity_gpus if capacity_gpus is not None else float(sum(n.usable_gpus for n in nodes))
    runnable = [p for p in pods if p.duration is not None]
    result = ReplayResult(capacity)
    events: list[tuple[float, int, int, str, int]] = []
    jobs: dict[str, _Job] = {}
    for seq, pod in enumerate(sorted(runnable, key=lambda p: (p.created, p.name))):
        assert pod.duration is not None  # runnable pods only
        jobs[pod.name] = _Job(pod, project_of(pod), pod.created, pod.duration)
        heapq.heappush(events, (pod.created, ARRIVE, seq, pod.name, 0))
    result.jobs = len(jobs)
    start = events[0][0] if events else 0.0
    end = max((p.created + p.duration for p in runnable if p.duration is not None), default=start)
    recent_from = max(start, end - RECENT_S)
    scheduler = Scheduler(Snapshot(tuple(nodes), (), start), policy, pm)
    last_t, allocated = start, 0.0
    per_project: dict[str, tuple[float, float]] = {}
    gpu_time = recent_time = 0.0
    deviation: dict[str, float] = {}
    next_sample = start
    while events:
        now = events[0][0]
        span = now - last_t
        gpu_time += allocated * span
        recent_time += allocated * max(0.0, now - max(last_t, recent_from))
        for name, (alloc, fair) in per_project.items():
            deviation[name] = deviation.get(name, 0.0) + abs(alloc - fair) * span
        last_t = now
        while events and events[0][0] == now:
            _, kind, seq, name, epoch = heapq.heappop(events)
            job = jobs[name]
            if kind == ARRIVE:
                scheduler.submit(pod_job(job.pod, name, job.project, now, seq))
            elif job.running and epoch == job.epoch:
                scheduler.finish(name)
                job.running, job.finished = False, now
        plan = scheduler.cycle(now)
        result.cycles += 1
        _carry_out(plan, jobs, events, now, result)
        allocated = sum(q.allocated.gpu for q in plan.queues if q.kind == "project")
        per_project = {q.name: (q.allocated.gpu, q.fair_share.gpu) for q in plan.queues if q.kind == "project"}
        if now >= next_sample or not events:
            result.series.append((now, 100.0 * allocated / capacity if capacity else 0.0))
            for name, (alloc, fair) in per_project.items():
                result.shares.setdefault(name, []).append((now, alloc, fair))
            next_sample = now + SAMPLE_EVERY_S
    total = max(last_t - start, 1e-9)
    result.utilisation_pct = 100.0 * gpu_time / (capacity * total) if capacity else 0.0
    result.utilisation_recent_pct = (100.0 * recent_time / (capacity * max(last_t - recent_from, 1e-9))
                                     if capacity else 0.0)
    waits = [j.started - j.submitted for j in jobs.values() if j.started is not None]
    jcts = [j.finished - j.submitted for j in jobs.values() if j.finished is not None]
    result.started = len(waits)
    result.finished = len(jcts)
    result.never_started = len(jobs) - len(waits)
    result.wait_s = summary(waits)
    result.jct_s = summary(jcts)
    result.production_wait_s = summary([j.pod.scheduled - j.pod.created for j in jobs.values()
                                         if j.pod.scheduled is not None])  # all of them: each ran
    quotas = {name: settings.quota_in(policy.default_pool).gpu for name, settings in policy.projects.items()}
    result.fairness = {name: {"quota_gpus": quotas.get(name, 0.0), "mad_gpus": dev / total}
                       for name, dev in sorted(deviation.items())}
    return result


def _carry_out(plan: Plan, jobs: dict[str, _Job], events: list, now: float, result: ReplayResult) -> None:
    """Apply a plan to the replay's bookkeeping: evictions first, then binds (which schedule finishes)."""
    for eviction in plan.evictions:
        job = jobs[eviction.job]
        job.epoch += 1
        job.running = False
        if eviction.moved:
            result.moves += 1
        else:
            result.evictions += 1
    for bind in plan.binds:
        job = jobs[bind.job]
        job.epoch += 1
        job.running = True
        job.starts += 1
        if job.started is None:
            job.started = now
        heapq.heappush(events, (now + job.duration, FINISH, 0, bind.job, job.epoch))
