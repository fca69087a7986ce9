"""The controller's /metrics page: jobs, GPUs, fair share, cycle time, evictions, API latency."""

from __future__ import annotations

import asyncio
from collections import Counter
from typing import TYPE_CHECKING, cast

from gpud.controller.event_loop import running_loop_name
from gpud.controller.loop_lag import WINDOW_S
from gpud.controller.nodes import DOWN
from gpud.controller.slices import Slices
from gpud.lifecycle import PENDING, STATES
from gpud.metrics import metric

if TYPE_CHECKING:
    from gpud.controller.service import Controller
    from gpud.jobs import Job

TALLY_STEP = 1000  # jobs counted between two looks at the clock of the slice (gpud.controller.slices)


async def render(ctrl: Controller) -> str:
    """Every metric in the Prometheus text format.

    The active jobs are counted a slice at a time (gpud.controller.slices), the event loop free between: a
    fleet's hundreds of thousands of pending jobs take a tenth of a second or more.
    """
    cluster = ctrl.cluster
    lines: list[str] = []
    by_state, allocated = await job_tallies(list(cluster.jobs.values()), ctrl.policy.default_pool)
    lines += metric("gpud_jobs", "gauge", "Active jobs by state and project.",
                    [({"state": s, "project": p}, n) for (s, p), n in sorted(by_state.items())])
    lines += metric("gpud_jobs_finished_total", "counter", "Jobs ended since the controller started, by state.",
                    [({"state": s}, cluster.job_service.finished_by_state.get(s, 0)) for s in STATES
                     if s not in ("PENDING", "RUNNING")])
    lines += metric("gpud_gpus_allocated", "gauge", "GPUs allocated by project and pool.",
                    [({"project": p, "pool": pool}, v) for (p, pool), v in sorted(allocated.items())])
    total: Counter[str] = Counter()
    unhealthy: Counter[str] = Counter()
    for node in cluster.nodes.values():
        if node.state != DOWN:
            total[node.pool] += len(node.gpus)
            unhealthy[node.pool] += sum(1 for g in node.gpus if not g.healthy)
    used = cast("dict[str, float]", Counter())
    for (project, pool), value in allocated.items():
        used[pool] += value
    lines += metric("gpud_gpus_idle", "gauge", "GPUs not allocated, by pool (nodes not down).",
                    [({"pool": pool}, max(0.0, total[pool] - used[pool])) for pool in sorted(total)])
    lines += metric("gpud_gpus_unhealthy", "gauge", "GPUs reported unhealthy, by pool.",
                    [({"pool": pool}, unhealthy[pool]) for pool in sorted(total)])
    node_states = Counter(n.state for n in cluster.nodes.values())
    lines += metric("gpud_nodes", "gauge", "Nodes by state.",
                    [({"state": s}, c) for s, c in sorted(node_states.items())])
    queues = cluster.last_plan.queues if cluster.last_plan is not None else ()
    lines += metric("gpud_queue_fair_share_gpus", "gauge", "Each queue's GPU fair share in the last cycle.",
                    [({"queue": q.name, "kind": q.kind, "pool": q.pool}, q.fair_share.gpu) for q in queues])
    lines += metric("gpud_queue_allocated_gpus", "gauge", "Each queue's allocated GPUs in the last cycle.",
                    [({"queue": q.name, "kind": q.kind, "pool": q.pool}, q.allocated.gpu) for q in queues])
    lines += metric("gpud_queue_quota_gpus", "gauge", "Each queue's GPU quota.",
                    [({"queue": q.name, "kind": q.kind, "pool": q.pool}, q.quota.gpu) for q in queues])
    lines += metric("gpud_evictions_total", "counter", "Evictions by rule since the controller started.",
                    [({"rule": r}, n) for r, n in sorted(cluster.plans.evictions_by_rule.items())])
    lines += metric("gpud_preemption_lost_gpu_seconds_total", "counter",
                    "GPU-seconds preempted jobs had run since their last checkpoint when stopped, by project, "
                    "since the controller started.",
                    [({"project": p}, s) for p, s in sorted(cluster.plans.preemptions.lost_by_project.items())])
    lines += ctrl.cycle_seconds.render()
    lines += metric("gpud_scheduler_builds_total", "counter", "Cycles that built the scheduler anew from every node "
                    "and job (the first, then after a change of the nodes or the policy) since the controller started.",
                    [({}, ctrl.builds)])
    lines += ctrl.api_seconds.render()
    lines += metric("gpud_store_batches_total", "counter", "Transactions written to the store.",
                    [({}, ctrl.persist.batches)])
    usage = ctrl.charger.decayed_usage()
    # Seconds, Prometheus's base unit; a gauge, not a counter: decayed usage goes down as it ages.
    lines += metric("gpud_usage_gpu_seconds", "gauge", "Decayed GPU usage of each department and project in "
                    "GPU-seconds, as of the last charge.",
                    [({"level": level, "pool": pool, "name": name}, round(value, 3))
                     for (level, pool, name), value in sorted(usage.items()) if level != "user"])
    lines += metric("gpud_usage_charges_total", "counter", "Usage charges written since the controller started.",
                    [({}, ctrl.charger.charges)])
    lines += metric("gpud_usage_charge_seconds", "gauge", "Time the last usage charge took, its write included.",
                    [({}, round(ctrl.charger.last_charge_s, 6))])
    lines += metric("gpud_loop_lag_seconds", "gauge", "How late the controller's event loop ran at worst over the "
                    f"last {WINDOW_S:g} seconds (every request and node message waits for it).",
                    [({}, round(ctrl.loop_lag.worst_s(asyncio.get_running_loop().time()), 6))])
    lines += metric("gpud_event_loop_info", "gauge", "The event loop the controller runs on: uvloop, or asyncio "
                    "(Python's own) with GPUD_EVENT_LOOP=asyncio or without uvloop.",
                    [({"loop": running_loop_name()}, 1)])
    passes = ctrl.full_passes
    if passes is not None:
        lines += metric("gpud_gc_full_passes_total", "counter", "Full passes of Python's garbage collector (each "
                        "holds every thread) since the controller started.", [({}, passes.passes)])
        lines += metric("gpud_gc_full_pass_longest_seconds", "gauge", "CPU time of the longest full pass so far.",
                        [({}, round(passes.longest_s, 6))])
        lines += metric("gpud_gc_freezes_total", "counter", "Times the survivors of a long full pass were moved "
                        "where later passes skip them.", [({}, passes.freezes)])
    return "\n".join(lines) + "\n"


async def job_tallies(jobs: list[Job], default_pool: str) -> tuple[Counter[tuple[str, str]],
                                                                  dict[tuple[str, str], float]]:
    """The jobs by (state, project), and the GPUs they hold by (project, pool): one walk, a slice at a time."""
    by_state: Counter[tuple[str, str]] = Counter()
    allocated = cast("dict[tuple[str, str], float]", Counter())  # GPUs, some of them fractions
    slices = Slices()
    for start in range(0, len(jobs), TALLY_STEP):
        await slices.pause()
        for job in jobs[start:start + TALLY_STEP]:
            by_state[(job.state, job.project)] += 1
            if job.state != PENDING:  # a job waiting again was stopped everywhere: it holds nothing
                allocated[(job.project, job.pool or default_pool)] += job.gpus_held()
    return by_state, allocated
