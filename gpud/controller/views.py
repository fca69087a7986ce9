"""Jobs, nodes and queues as the API shows them (docs/api.md)."""

from __future__ import annotations

from typing import Mapping

from gpud.controller.job_reason import JobReason
from gpud.controller.nodes import NodeRecord
from gpud.jobs import Job, gpus_of
from gpud.model import QueueReport, Resources
from gpud.policy import TimeSlicing

# What only a job's owner and the admins see: what it runs, with what secrets, and where it writes.
CONFIDENTIAL = ("command", "script", "env", "workdir", "output", "error")

# Every field of a listed job object: job_view's, the expected start's (pending jobs) and public_view's mark.
JOB_VIEW_FIELDS = frozenset((
    "id", "name", "user", "project", "state", "reason", "reason_code", "reason_short", "priority_class", "priority",
    "gpus", "gpu_memory_gib", "tasks", "min_tasks", "cpus", "memory_gib", "constraint", "pool", "workdir", "command",
    "script", "env", "time_limit_s", "array_id", "array_index", "array_limit", "depends", "hold", "requeue",
    "stop_signal", "output", "error", "signal", "last_checkpoint", "checkpoints", "lost_gpu_hours", "submitted",
    "started", "ended", "restart_count", "exit_code", "term_signal", "nodes", "elapsed_s", "placements", "gpu_hours",
    "gpu_compute_request", "gpu_compute_limit", "sharing", "interactive", "max_rss_bytes", "cpu_s", "limits",
    "estimated_start", "reserved_start", "start_nodes", "no_estimate", "confidential"))


def job_view(job: Job, reason: JobReason, nodes: Mapping[str, NodeRecord], now: float,
             slicing: TimeSlicing | None = None) -> dict:
    """The API's job object: what was asked, where it runs, how it ended, and how its GPU share is kept.

    ``reason`` gives its words (``reason``), its kind (``reason_code``) and its leading clause (``reason_short``).
    """
    placements: list[dict[str, object] | None] = []
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
        "reason": reason.text, "reason_code": reason.code, "reason_short": reason.short,
        "priority_class": job.priority_class, "priority": job.priority,
        "gpus": job.gpus, "gpu_memory_gib": job.gpu_memory_gib, "tasks": job.tasks,
        "min_tasks": job.min_tasks, "cpus": job.cpus, "memory_gib": job.memory_gib,
        "constraint": job.constraint, "pool": job.pool, "workdir": job.workdir, "command": job.command,
        "script": job.script, "env": job.env, "time_limit_s": job.time_limit_s, "array_id": job.array_id,
        "array_index": job.array_index, "array_limit": job.array_limit,
        "depends": [f"{d.kind}:{d.job}" for d in job.depends], "hold": job.hold, "requeue": job.requeue,
        "stop_signal": job.stop_signal, "output": job.output, "error": job.error,
        "signal": (None if job.warn_signal is None else
                   {"signal": job.warn_signal, "lead_s": job.warn_lead_s, "batch_only": job.warn_batch_only}),
        "last_checkpoint": job.last_checkpoint, "checkpoints": [dict(c) for c in job.checkpoints],
        "lost_gpu_hours": round(job.lost_gpu_seconds / 3600.0, 6),
        "submitted": job.submitted, "started": job.started, "ended": job.ended,
        "restart_count": job.restart_count, "exit_code": job.exit_code, "term_signal": job.term_signal,
        # A requeued job waiting again runs nowhere; a finished one shows where it ran.
        "nodes": job.nodes() or ([] if job.state == "PENDING" else list(dict.fromkeys(h for h in job.hosts if h))),
        "elapsed_s": round(job.elapsed(now), 3),
        "placements": placements, "gpu_hours": round(gpu_seconds / 3600.0, 6),
        "gpu_compute_request": job.gpu_compute_request, "gpu_compute_limit": job.gpu_compute_limit,
        "sharing": sharing_view(job, nodes, slicing or TimeSlicing()),
        "interactive": job.interactive,
        "max_rss_bytes": job.max_rss_bytes, "cpu_s": None if job.cpu_s is None else round(job.cpu_s, 3),
        "limits": limits_view(job, nodes),
    }


def public_view(view: dict, job: Job) -> dict:
    """The job as other users see it: ``view`` without its command, environment and paths.

    Free text that may quote the workdir (the reason, event messages) has it
    replaced, so a failed start does not tell a stranger where the job writes.
    """
    shown = {key: value for key, value in view.items() if key not in CONFIDENTIAL}
    shown["confidential"] = True
    shown["reason"] = redact(shown.get("reason"), job)
    if "reason_short" in shown:
        shown["reason_short"] = redact(shown["reason_short"], job)
    if "events" in shown:
        shown["events"] = [{**event, "message": redact(event.get("message"), job)} for event in shown["events"]]
    if "elements" in shown:
        shown["elements"] = [{**element, "reason": redact(element.get("reason"), job)} for element in shown["elements"]]
    return shown


def redact(text: str | None, job: Job) -> str | None:
    """``text`` with the job's workdir replaced (None stays None)."""
    if not text or not job.workdir or job.workdir == "/":
        return text
    return text.replace(job.workdir.rstrip("/"), "<workdir>")


def limits_view(job: Job, nodes: Mapping[str, NodeRecord]) -> dict | None:
    """What holds the job to what it asked for on the nodes it ran on (None before it ran anywhere)."""
    names = job.nodes() or list(dict.fromkeys(h for h in job.hosts if h))
    known = [nodes[name] for name in names if name in nodes]
    if not known:
        return None
    enforced = [limit for limit in known[0].limits if all(limit in node.limits for node in known)]
    return {"enforced": enforced, "how": "; ".join(sorted({n.limits_how for n in known if n.limits_how}))}


def _unmeasuring(job: Job, nodes: Mapping[str, NodeRecord], what: str) -> str:
    """The first node the job ran on that says its GPUs cannot measure ``what``; "" when none says so."""
    names = job.nodes() or list(dict.fromkeys(h for h in job.hosts if h))
    for name in names:
        node = nodes.get(name)
        if node is not None and node.gpu_measures is not None and what not in node.gpu_measures:
            return name
    return ""


def sharing_view(job: Job, nodes: Mapping[str, NodeRecord], slicing: TimeSlicing) -> dict | None:
    """Whether a job sharing a GPU has its compute share and its memory slice enforced or only advised.

    None for jobs that share no GPU (whole GPUs or none).
    """
    if job.gpu_memory_gib is None and not 0 < job.gpus < 1:
        return None
    request, limit = slicing.compute(job.gpus, job.gpu_memory_gib, job.gpu_compute_request, job.gpu_compute_limit)
    blind_to_use = _unmeasuring(job, nodes, "utilization")
    if slicing.sliced and slicing.mode == "fair" and blind_to_use:
        compute = {"mode": slicing.mode, "request": request, "limit": limit, "enforced": False,
                   "how": f"advisory: node {blind_to_use} cannot measure GPU utilisation, so fair time-slicing "
                          f"cannot see a job go idle"}
    elif slicing.sliced:
        compute = {"mode": slicing.mode, "request": request, "limit": limit, "enforced": True,
                   "how": f"{slicing.mode} time-slicing by the node: leases of {slicing.lease_ms:g} ms in plans of "
                          f"{slicing.lease_ms / slicing.precision / 1000:g} s"}
    else:
        compute = {"mode": "off", "request": request, "limit": limit, "enforced": False,
                   "how": "advisory: time-slicing is off, the driver shares the GPU evenly among its processes"}
    placed = next((r.placement for r in job.runs if r.placement is not None and r.placement.gpu_index), None)
    limit_gib = job.gpu_memory_gib
    if limit_gib is None and placed is not None and placed.node in nodes:
        memory = next((g.memory_gib for g in nodes[placed.node].gpus if g.index == placed.gpu_index[0]), None)
        limit_gib = round(placed.gpu_share * memory, 3) if memory else None
    blind_to_memory = _unmeasuring(job, nodes, "memory")
    if blind_to_memory:
        how = f"advisory: node {blind_to_memory} cannot measure each process's GPU memory"
    elif slicing.memory_enforce:
        how = (f"the node stops the job {slicing.memory_grace_s:g} s after it holds more than its slice "
               f"+{slicing.memory_tolerance:.0%}")
    else:
        how = f"advisory: the node only warns past the slice +{slicing.memory_tolerance:.0%}"
    return {"compute": compute,
            "memory": {"limit_gib": limit_gib, "enforced": slicing.memory_enforce and not blind_to_memory, "how": how,
                       "env": "GPUD_GPU_MEMORY_LIMIT_MIB, XLA_PYTHON_CLIENT_MEM_FRACTION, "
                              "PyTorch per-process fraction"}}


def node_view(node: NodeRecord, used: Mapping[int, float], busy: bool, now: float,
              host_used: tuple[float, float] = (0.0, 0.0)) -> dict:
    """The API's node object: inventory, state, and how much of each GPU, of its CPUs and memory is in use.

    ``busy`` says whether any task (GPU or CPU-only) is placed on the node;
    ``host_used`` is the CPUs and GiB of memory its placed tasks hold.
    """
    gpus = [{"index": g.index, "uuid": g.uuid, "model": g.model, "memory_gib": g.memory_gib,
             "healthy": g.healthy, "used": round(used.get(g.index, 0.0), 6)} for g in node.gpus]
    gpus_used = sum(min(1.0, used.get(g.index, 0.0)) for g in node.gpus)
    return {"name": node.name, "pool": node.pool, "state": node.display_state(busy),
            "reason": node.reason, "labels": node.labels, "cpus": node.cpus, "memory_gib": node.memory_gib,
            "cpus_used": round(host_used[0], 6), "memory_used_gib": round(host_used[1], 6), "gpus": gpus, "gpus_used": round(gpus_used, 6), "gpus_idle": round(len(node.gpus) - gpus_used, 6),
            "address": node.address, "last_seen": node.last_seen,
            "limits": {"enforced": list(node.limits), "how": node.limits_how},
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
