"""The live cluster as a scenario document (docs/scenarios.md), for ``gpuctl simulate --from-controller``."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from gpud.controller.nodes import DOWN

if TYPE_CHECKING:
    from gpud.controller.service import Controller


def live_state(ctrl: Controller) -> dict[str, Any]:
    """The policy file's tables, the nodes that are not down, and the jobs the scheduler considers."""
    nodes = []
    for node in ctrl.cluster.nodes.values():
        if node.state == DOWN:
            continue
        spec = node.spec()
        nodes.append({"name": spec.name, "gpus": spec.gpus, "gpu_memory_gib": spec.gpu_memory_gib,
                      "cpus": spec.cpus, "memory_gib": spec.memory_gib, "pool": spec.pool,
                      "labels": {k: v for k, v in node.labels.items()}})
    jobs = []
    for job_id in sorted(ctrl.cluster.core.in_core):
        job = ctrl.cluster.jobs[job_id]
        entry: dict[str, Any] = {"name": job.id, "project": job.project, "priority": job.priority,
                                 "tasks": job.tasks, "cpus": job.cpus, "memory_gib": job.memory_gib,
                                 "submitted": job.submitted}
        if job.gpu_memory_gib is not None:
            entry["gpu_memory_gib"] = job.gpu_memory_gib
        elif job.gpus:
            entry["gpus"] = job.gpus
        if job.min_tasks is not None:
            entry["min_tasks"] = job.min_tasks
        if job.constraint:
            entry["node_selector"] = dict(job.constraint)
        if job.pool:
            entry["pool"] = job.pool
        placements = job.placements()
        if any(p is not None for p in placements):
            entry["running_on"] = [p.node if p else "" for p in placements]
            entry["gpu_index"] = [list(p.gpu_index) if p else [] for p in placements]
            entry["started"] = job.started
        jobs.append(entry)
    return {"now": time.time(), "policy": ctrl.policy_data, "nodes": nodes, "jobs": jobs}
