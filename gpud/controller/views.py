"""Jobs, nodes and queues as the API shows them (docs/api.md)."""

from __future__ import annotations

from typing import Mapping

from gpud.controller.nodes import NodeRecord
from gpud.jobs import Job, gpus_of
from gpud.model import QueueReport, Resources


def job_view(job: Job, reason: str, nodes: Mapping[str, NodeRecord], now: float) -> dict:
    """The API's job object: what was asked, where it runs, how it ended."""
    placements = []
    for run in job.runs:
        p = run.placement
        if p is None:
            placements.append(None)
            continue
        node = nodes.get(p.node)
        placements.append({"node": p.node, "gpus": list(p.gpu_index), "share": p.gpu_share,
                           "gpu_uuids": node.uuids(p.gpu_index) if node else [], "state": run.state,
                           "attempt": run.attempt})
    gpu_seconds = job.gpu_seconds + sum(max(0.0, now - run.since) * gpus_of(run.placement)
                                        for run in job.runs if run.placement is not None and run.since)
    return {
        "id": job.id, "name": job.name, "user": job.user, "project": job.project, "state": job.state,
        "reason": reason, "priority_class": job.priority_class, "priority": job.priority,
        "gpus": job.gpus, "gpu_memory_gib": job.gpu_memory_gib, "tasks": job.tasks,
        "min_tasks": job.min_tasks, "cpus": job.cpus, "memory_gib": job.memory_gib,
        "constraint": job.constraint, "pool": job.pool, "workdir": job.workdir, "command": job.command,
        "script": job.script, "env": job.env, "time_limit_s": job.time_limit_s, "array_id": job.array_id,
        "array_index": job.array_index, "array_limit": job.array_limit,
        "depends": [f"{d.kind}:{d.job}" for d in job.depends], "hold": job.hold, "requeue": job.requeue,
        "stop_signal": job.stop_signal, "output": job.output, "error": job.error,
        "submitted": job.submitted, "started": job.started, "ended": job.ended,
        "restart_count": job.restart_count, "exit_code": job.exit_code, "term_signal": job.term_signal,
        "nodes": job.nodes() or list(dict.fromkeys(h for h in job.hosts if h)),
        "placements": placements, "gpu_hours": round(gpu_seconds / 3600.0, 6),
    }


def node_view(node: NodeRecord, used: Mapping[int, float], busy: bool, now: float) -> dict:
    """The API's node object: inventory, state, and how much of each GPU is in use.

    ``busy`` says whether any task (GPU or CPU-only) is placed on the node.
    """
    gpus = [{"index": g.index, "uuid": g.uuid, "model": g.model, "memory_gib": g.memory_gib,
             "healthy": g.healthy, "used": round(used.get(g.index, 0.0), 6)} for g in node.gpus]
    gpus_used = sum(min(1.0, used.get(g.index, 0.0)) for g in node.gpus)
    return {"name": node.name, "pool": node.pool, "state": node.display_state(busy),
            "reason": node.reason, "labels": node.labels, "cpus": node.cpus, "memory_gib": node.memory_gib,
            "gpus": gpus, "gpus_used": round(gpus_used, 6), "gpus_idle": round(len(node.gpus) - gpus_used, 6),
            "address": node.address, "last_seen": node.last_seen,
            "seconds_since_heartbeat": round(max(0.0, now - node.last_seen), 3)}


def resources_view(amount: Resources) -> dict:
    """An amount of resources as a JSON object (infinite quotas as null)."""
    return {name: (None if value == float("inf") else round(value, 6))
            for name, value in (("gpu", amount.gpu), ("cpu", amount.cpu), ("memory", amount.memory))}


def queue_view(queue: QueueReport, pending: int, running: int) -> dict:
    """The API's queue object: a project or department in one pool, with its quota and fair share."""
    return {"name": queue.name, "kind": queue.kind, "pool": queue.pool, "department": queue.department,
            "quota": resources_view(queue.quota), "fair_share": resources_view(queue.fair_share),
            "allocated": resources_view(queue.allocated), "demand": resources_view(queue.demand),
            "pending_jobs": pending, "running_jobs": running}
