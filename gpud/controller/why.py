"""``gpuctl why``: every reason a job waits, with its numbers, and what would let it start."""

from __future__ import annotations

from gpud.controller.cluster import Cluster
from gpud.jobs import Job
from gpud.lifecycle import PENDING
from gpud.model import EPS


def explain(job: Job, cluster: Cluster) -> dict:
    """The job's state, its blockers (each a sentence with numbers) and what would let it start."""
    reason = cluster.reason_of(job)
    answer = {"id": job.id, "state": job.state, "reason": reason, "blockers": [], "would_start": []}
    if job.state != PENDING:
        return answer
    blockers, would = answer["blockers"], answer["would_start"]
    if job.hold:
        blockers.append("the job is held")
        would.append(f"gpuctl release {job.id}")
    for dep in job.depends:
        if dep.met is None:
            blockers.append(f"waits for job {dep.job} to end ({dep.kind})")
            would.append(f"job {dep.job} ending" + (" successfully" if dep.kind == "afterok" else ""))
        elif dep.met is False:
            blockers.append(f"job {dep.job} ended in a way {dep.kind} does not accept: this job can never start")
            would.append(f"gpuctl cancel {job.id} and submit again without --depends {dep.kind}:{dep.job}")
    if blockers:
        return answer
    if reason and reason != "waiting for the next scheduling cycle":
        blockers.append(reason)
    pool = job.pool or cluster.policy.default_pool
    _queue_facts(job, cluster, pool, blockers, would)
    _node_facts(job, cluster, pool, blockers, would)
    return answer


def _queue_facts(job: Job, cluster: Cluster, pool: str, blockers: list, would: list) -> None:
    plan = cluster.last_plan
    if plan is None:
        return
    per_task = job.gpus if job.gpu_memory_gib is None else 0.0
    want = per_task * job.tasks
    for queue in plan.queues:
        if queue.kind != "project" or queue.name != job.project or queue.pool != pool:
            continue
        quota, fair, allocated = queue.quota.gpu, queue.fair_share.gpu, queue.allocated.gpu
        blockers.append(f"project {job.project} in pool {pool}: {allocated:g} GPUs allocated, quota "
                        f"{quota:g}, fair share {fair:.2f}; this job needs {want:g} more")
        if job.priority >= 100 and allocated + want > quota + EPS:
            would.append(f"project {job.project} using at most {max(0.0, quota - want):g} GPUs of its quota "
                         f"(priority {job.priority} jobs run only within quota), or a larger quota")
        elif allocated + want > fair + EPS:
            would.append("idle GPUs in the pool, or other projects' jobs ending (this project is at or over "
                         "its fair share)")


def _node_facts(job: Job, cluster: Cluster, pool: str, blockers: list, would: list) -> None:
    matching = [n for n in cluster.nodes.values() if n.pool == pool
                and all(n.labels.get(k) == v or (k == "pool" and v == n.pool) for k, v in job.constraint.items())]
    if not matching:
        wanted = ", ".join(f"{k}={v}" for k, v in job.constraint.items())
        blockers.append(f"no node in pool {pool} has {wanted}" if wanted else f"no node is in pool {pool}")
        would.append("a node with those labels registering, or a different --constraint")
        return
    usable = [n for n in matching if n.spec().schedulable]
    if not usable:
        blockers.append(f"all {len(matching)} matching nodes are down, drained or have a faulty GPU")
        would.append("gpuctl resume NODE, or a matching node coming back")
        return
    if job.gpus >= 1:
        used = _whole_gpus_used(cluster)
        best = max(len(n.gpus) - used.get(n.name, 0) for n in usable)
        if best < job.gpus:
            blockers.append(f"the most free GPUs on one matching node is {best}; each task needs {job.gpus:g}")
            would.append(f"{job.gpus - best:g} more GPUs freeing on one node")


def _whole_gpus_used(cluster: Cluster) -> dict[str, int]:
    used: dict[str, set] = {}
    for other in cluster.jobs.values():
        for run in other.runs:
            if run.placement is not None:
                used.setdefault(run.placement.node, set()).update(run.placement.gpu_index)
    return {name: len(indices) for name, indices in used.items()}
