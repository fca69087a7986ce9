"""``gpuctl why``: every reason a job waits, as data with its numbers, and what would let it start.

Each blocker is a dict naming its ``rule`` and carrying the numbers it
compared; each "would start if" is a dict naming its ``condition``, who can
bring it about (``who``: the job's owner, the project's users, an admin, or
the cluster as jobs end) and the amounts. ``message`` words each for people;
nothing reads a message back. A job that can never start under the policy
says so (``never``), and its conditions are then changes only a person makes.
``standing`` says where the job's project stands (context, not a blocker);
``expected`` what the controller expects to happen by itself and when (a
reclaim once victims pass the minimum run time).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from gpud.controller.cluster import Cluster
from gpud.controller.why_limits import limit_facts
from gpud.jobs import Job
from gpud.lifecycle import PENDING, RUNNING
from gpud.core.blockers import SHORTAGE
from gpud.model import EPS, NON_PREEMPTIBLE_PRIORITY, Blocker, QueueReport, Resources
from gpud.reasons import blocker_data

OWNER = "owner"
PROJECT = "project"
ADMIN = "admin"
CLUSTER = "cluster"


def explain(job: Job, cluster: Cluster) -> dict:
    """The job's state, its blockers and what would let it start, as data (see the module)."""
    reason = cluster.waits.reason_of(job)
    answer: dict[str, Any] = {"id": job.id, "state": job.state, "reason": reason, "never": False, "blockers": [],
                              "would_start": [], "standing": [], "expected": []}
    answer["start"] = cluster.waits.start_of(job)  # the expected start, from the same plan (gpud.core.reservations)
    if job.state != PENDING:
        return answer
    blockers, would = answer["blockers"], answer["would_start"]
    if job.hold:
        blockers.append(_item("held", "the job is held"))
        would.append(_if("released", OWNER, f"gpuctl release {job.id}"))
    for dep in job.depends:
        if dep.met is None:
            blockers.append(_item("dependency", f"waits for job {dep.job} to end ({dep.kind})",
                                  job=dep.job, kind=dep.kind))
            would.append(_if("job_ended", OWNER, f"job {dep.job} ending"
                             + (" successfully" if dep.kind == "afterok" else ""), job=dep.job))
        elif dep.met is False:
            answer["never"] = True
            blockers.append(_item("dependency", f"job {dep.job} ended in a way {dep.kind} does not accept: "
                                  "this job can never start", job=dep.job, kind=dep.kind, never=True))
            would.append(_if("resubmitted", OWNER, f"gpuctl cancel {job.id} and submit again without "
                             f"--depends {dep.kind}:{dep.job}"))
    stopping = cluster.completing.of(job.id)
    if stopping:
        grace = cluster.policy.grace_period_s
        blockers.append(_item("completing", reason, grace_s=grace, stopping=[
            {"node": s.node, "task": s.task, "attempt": s.attempt, "since": s.since} for s in stopping]))
        would.append(_if("previous_run_ended", CLUSTER, "its previous run ending (the node stops it, SIGKILL "
                         f"after the {grace:g} s grace period at the latest)",
                         nodes=sorted({s.node for s in stopping})))
    elif job.id in cluster.fenced:
        until, node = cluster.fenced[job.id]
        blockers.append(_item("fenced", reason, node=node, until=until))
        would.append(_if("lease_over", CLUSTER, f"node {node}'s lease and grace period running out", node=node,
                         until=until))
    if job.array_limit is not None and job.id not in cluster.core.in_core:
        queued = cluster.job_service.array_queued.get(job.array_id, 0)
        blockers.append(_item("array_limit", f"array {job.array_id} already has {queued} elements queued or running, "
                              f"its limit (%{job.array_limit})", array=job.array_id, limit=job.array_limit,
                              queued=queued))
        would.append(_if("array_element_ends", CLUSTER, f"an element of array {job.array_id} ending",
                         array=job.array_id))
    if blockers:
        return answer
    waiting = cluster.waits.waiting_of(job)
    core = waiting.blocker if waiting is not None else None
    if waiting is not None:
        # The scheduler's own blocker, as it gave it: the rule and its numbers, and the queue it judged.
        blockers.append(_item("scheduler", reason, blocker=blocker_data(core) if core is not None else None,
                              queue=_queue_data(waiting.queue) if waiting.queue is not None else None))
    elif job.reason:  # what the controller last recorded (a requeue), until a cycle judges the job
        blockers.append(_item("scheduler", job.reason))
    facts = _Facts.of(job, cluster)
    never = _queue_facts(job, cluster, facts, blockers, would, core, answer["standing"])
    never = limit_facts(job, cluster, facts.want, blockers, would) or never
    never = _node_facts(job, cluster, facts, blockers, would, never, core) or never
    answer["never"] = never
    due = None if never else _reclaim_due(job, cluster, facts, core)
    if due is not None:
        answer["expected"].append(due)
    if never:  # no load change starts it: only what a person changes is worth saying
        would[:] = [c for c in would if c["who"] in (OWNER, ADMIN)]
    else:
        if any(c["condition"] in ("node_frees", "task_room") for c in would):
            # GPUs idle somewhere in the pool may be split over nodes; room on a named node is what starts it.
            would[:] = [c for c in would if c["condition"] != "idle_gpus"]
        load = [c for c in would if c["who"] in (PROJECT, CLUSTER)]
        if len(load) > 1:  # each alone would not start it (a limit and a full node): they are one condition
            who = CLUSTER if any(c["who"] == CLUSTER for c in load) else PROJECT
            would[:] = [c for c in would if c["who"] not in (PROJECT, CLUSTER)] + [
                _if("all_of", who, "; and ".join(c["message"] for c in load), conditions=load)]
    return answer


def _item(rule: str, message: str, **data: object) -> dict:
    """A blocker: the rule, its numbers, and its words."""
    return {"rule": rule, **data, "message": message}


def _if(condition: str, who: str, message: str, **data: object) -> dict:
    """A condition under which the job would start: what, who can bring it about, the numbers, the words."""
    return {"condition": condition, "who": who, **data, "message": message}


@dataclass
class _Facts:
    """What the job asks for, per task and for the tasks that must start together."""

    pool: str
    tasks: int          # tasks that must start together (the gang minimum)
    gpu: float          # GPUs per task (a memory slice as its share of the smallest GPU holding it)
    whole: int          # whole GPUs per task, 0 for a fraction or none
    cpu: float
    memory: float

    @staticmethod
    def of(job: Job, cluster: Cluster) -> _Facts:
        pool = job.pool or cluster.policy.default_pool
        gpu = job.gpus
        if job.gpu_memory_gib is not None:
            sizes = [g.memory_gib for n in cluster.nodes.values() if n.pool == pool for g in n.gpus
                     if g.memory_gib >= job.gpu_memory_gib - EPS]
            gpu = job.gpu_memory_gib / min(sizes) if sizes else 1.0
        whole = int(job.gpus) if job.gpu_memory_gib is None and job.gpus >= 1 else 0
        tasks = job.min_tasks if job.min_tasks is not None else job.tasks
        return _Facts(pool, max(tasks, 1), gpu, whole, job.cpus, job.memory_gib)

    @property
    def want(self) -> float:
        """GPUs the tasks that must start together hold."""
        return self.gpu * self.tasks


def _gpus(amount: float) -> str:
    return f"{amount:g} GPU" + ("" if amount == 1 else "s")


def _queue_data(report: QueueReport) -> dict:
    """A queue as the scheduler's cycle left it, as data."""
    return {"kind": report.kind, "name": report.name, "pool": report.pool,
            **{field: {"gpu": round(amount.gpu, 6), "cpu": round(amount.cpu, 6), "memory": round(amount.memory, 6)}
               for field, amount in (("allocated", report.allocated), ("quota", report.quota),
                                     ("fair_share", report.fair_share))}}


def _queue_facts(job: Job, cluster: Cluster, facts: _Facts, blockers: list, would: list,
                 core: Blocker | None, standing: list) -> bool:
    """The project's and department's rules that hold the job back; True when no change of load can start it.
    Where the project stands (allocated, quota, fair share) goes to ``standing``: it is context, not a blocker.

    The amounts are the scheduler's: what each queue holds and what its
    non-preemptible jobs hold (its reports), and, when it found the pool short
    of GPUs, how many were free (its blocker)."""
    plan = cluster.last_plan
    policy = cluster.policy
    settings = policy.projects.get(job.project)
    if plan is None or settings is None:
        return False
    pool, want = facts.pool, facts.want
    reports = {(q.kind, q.name): q for q in plan.queues if q.pool == pool}
    project = reports.get(("project", job.project))
    if project is None:
        return False
    department = policy.departments.get(settings.department)
    levels: list[tuple[str, str, Any, Any]] = [("project", job.project, settings, project)]
    if department is not None and not department.implicit:
        report = reports.get(("department", department.name))
        if report is not None:
            levels.append(("department", department.name, department, report))
    allocated, quota, fair = project.allocated.gpu, project.quota.gpu, project.fair_share.gpu
    standing.append(_item("share", f"project {job.project} in pool {pool}: {allocated:g} GPUs allocated, quota "
                          f"{quota:g}, fair share {fair:.2f}; this job needs {want:g} more",
                          project=job.project, pool=pool, allocated=allocated, quota=quota,
                          fair_share=round(fair, 6), need=want))
    never = False
    limited = False
    for kind, name, level, report in levels:
        limit = level.limit_in(pool)
        if limit is None or want <= EPS:
            continue
        cap = limit.gpu
        if want > cap + EPS:
            never = True
            blockers.append(_item("limit", f"the job needs {_gpus(want)}, more than {kind} {name}'s limit of "
                                  f"{cap:g} in pool {pool}: it can never start as asked", level=kind, name=name,
                                  pool=pool, limit=cap, need=want, never=True))
            would.append(_if("limit_at_least", ADMIN, f"an admin raising {kind} {name}'s GPU limit in pool "
                             f"{pool} to at least {want:g} (policy file)", level=kind, name=name, pool=pool,
                             gpu=want))
        elif report.allocated.gpu + want > cap + EPS:
            limited = True
            blockers.append(_item("limit", f"{kind} {name} holds {report.allocated.gpu:g} of its limit of "
                                  f"{cap:g} GPUs in pool {pool}", level=kind, name=name, pool=pool, limit=cap,
                                  allocated=report.allocated.gpu, need=want))
            would.append(_if("level_holds_at_most", PROJECT, f"{kind} {name}'s jobs in pool {pool} holding at "
                             f"most {cap - want:g} GPUs (jobs of it ending), or an admin raising its limit",
                             level=kind, name=name, pool=pool, gpu=cap - want))
    if job.priority >= NON_PREEMPTIBLE_PRIORITY and want > EPS:
        for kind, name, level, report in levels:
            bound = level.quota_in(pool).gpu
            held = report.fixed.gpu
            if want > bound + EPS:
                never = True
                blockers.append(_item("quota", f"priority {job.priority} jobs run only within quota, and the job "
                                      f"needs {_gpus(want)}, more than {kind} {name}'s quota of {bound:g} in pool "
                                      f"{pool}: it can never start as asked", level=kind, name=name, pool=pool,
                                      quota=bound, need=want, never=True))
                limit = level.limit_in(pool)
                # A limit may not be below the quota: raising one past the limit raises both.
                both = limit is not None and limit.gpu + EPS < want
                would.append(_if("quota_at_least", ADMIN, f"an admin raising {kind} {name}'s GPU quota"
                                 + (" and limit" if both else "") + f" in pool {pool} to at least {want:g} "
                                 "(policy file)", level=kind, name=name, pool=pool, gpu=want,
                                 **({"limit": want} if both else {})))
                would.append(_if("preemptible", OWNER, "submitting it again with a preemptible priority (below "
                                 f"{NON_PREEMPTIBLE_PRIORITY}), which may use idle GPUs over quota",
                                 priority_below=NON_PREEMPTIBLE_PRIORITY))
            elif held + want > bound + EPS:
                blockers.append(_item("quota", f"{kind} {name}'s non-preemptible jobs hold {held:g} of its quota of "
                                      f"{bound:g} GPUs in pool {pool}", level=kind, name=name, pool=pool,
                                      quota=bound, held=held, need=want))
                would.append(_if("non_preemptible_at_most", PROJECT, f"{kind} {name}'s non-preemptible jobs in "
                                 f"pool {pool} holding at most {bound - want:g} GPUs (they hold {held:g}), or an "
                                 "admin raising its quota", level=kind, name=name, pool=pool, gpu=bound - want))
        return never
    if (not never and not limited and allocated + want > fair + EPS and core is not None
            and core.rule == SHORTAGE and core.resource == "gpu" and core.free + EPS < want):
        would.append(_if("idle_gpus", CLUSTER, f"{_gpus(want)} idle in pool {pool} (this project is at or over "
                         "its fair share, so it takes only idle GPUs)", pool=pool, gpu=want))
    return never


def _reclaim_due(job: Job, cluster: Cluster, facts: _Facts, core: Blocker | None) -> dict | None:
    """When jobs of other projects over their quota, too young to be evicted, pass the minimum run time and may be
    reclaimed for this job (None when the job is not short of GPUs within its fair share, or none are young)."""
    plan = cluster.last_plan
    if plan is None or core is None or core.rule != SHORTAGE or core.resource != "gpu" or facts.want <= EPS:
        return None
    reports = {(q.kind, q.name): q for q in plan.queues if q.pool == facts.pool}
    mine = reports.get(("project", job.project))
    if mine is None or mine.allocated.gpu + facts.want > mine.fair_share.gpu + EPS:
        return None  # a queue reclaims only what keeps it within its fair share
    now, min_runtime = cluster.clock(), cluster.policy.min_runtime_s
    young: list[tuple[float, str, Job]] = []
    for other in cluster.jobs.values():
        report = reports.get(("project", other.project))
        if (other.state != RUNNING or other.project == job.project or other.started is None or report is None
                or other.priority >= NON_PREEMPTIBLE_PRIORITY
                or (other.pool or cluster.policy.default_pool) != facts.pool
                or report.allocated.gpu <= report.quota.gpu + EPS):  # a queue within its quota is never a victim
            continue
        due = other.started + min_runtime
        if due > now:
            young.append((due, other.id, other))
    short = facts.want - max(core.free, 0.0)
    freed = 0.0
    chosen: list[Job] = []
    for due, _, other in sorted(young):
        chosen.append(other)
        freed += other.gpus_held()
        if freed + EPS >= short:
            ids = ", ".join(j.id for j in chosen)
            projects = ", ".join(sorted({j.project for j in chosen}))
            return {"event": "reclaim_due", "at": round(due, 3), "jobs": [j.id for j in chosen],
                    "projects": sorted({j.project for j in chosen}), "min_runtime_s": min_runtime,
                    "message": f"a reclaim is due: job{'s' if len(chosen) > 1 else ''} {ids} of {projects}, over "
                               f"quota, may be reclaimed for it once {'they have' if len(chosen) > 1 else 'it has'} "
                               f"run the minimum run time of {min_runtime:g} s, in {max(0.0, due - now):.0f} s"}
    return None


def _node_facts(job: Job, cluster: Cluster, facts: _Facts, blockers: list, would: list, never: bool,
                core: Blocker | None) -> bool:
    """Which nodes could hold a task, now and ever (after the cycle's binds and evictions, node by node:
    the scheduler's blocker counts them when it tried); True when none ever could, or a gang never fits."""
    pool = facts.pool
    matching = [n for n in cluster.nodes.values() if n.pool == pool
                and all(n.labels.get(k) == v or (k == "pool" and v == n.pool) for k, v in job.constraint.items())]
    if not matching:
        wanted = ", ".join(f"{k}={v}" for k, v in job.constraint.items())
        blockers.append(_item("constraint", f"no node in pool {pool} has {wanted}" if wanted
                              else f"no node is in pool {pool}", pool=pool, constraint=dict(job.constraint)))
        would.append(_if("node_registers", ADMIN, "a node with those labels registering, or a different "
                         "--constraint", pool=pool, constraint=dict(job.constraint)))
        return False
    usable = [n for n in matching if n.spec().schedulable]
    if not usable:
        blockers.append(_item("nodes_unavailable", f"all {len(matching)} matching nodes are down, drained or have "
                              "a faulty GPU", pool=pool, nodes=len(matching)))
        would.append(_if("node_resumes", ADMIN, "gpuctl resume NODE, or a matching node coming back", pool=pool))
        return False
    used = _used(cluster)
    per_task = {"gpu": facts.gpu, "cpu": facts.cpu, "memory": facts.memory}
    slots_now, slots_ever, holders = 0, 0, 0
    short: list[tuple[float, float, float, str]] = []
    for node in usable:
        spec = node.spec()
        capacity = Resources(float(spec.usable_gpus), spec.cpus, spec.memory_gib)
        held = used.get(node.name, Resources())
        shares = _gpu_free(cluster, node.name, len(node.gpus), spec.out_of_service)
        whole_free = sum(1 for share in shares if share >= 1.0 - EPS)
        free = Resources(capacity.gpu - held.gpu, capacity.cpu - held.cpu, capacity.memory - held.memory)
        ever = _slots(capacity, [1.0] * spec.usable_gpus, facts)
        now = _slots(free, shares, facts)
        slots_ever += ever
        slots_now += now
        if now:
            holders += 1
        elif ever:
            gpu_short = max(0.0, (facts.whole or facts.gpu) - (whole_free if facts.whole else max(shares, default=0.0)))
            short.append((gpu_short, max(0.0, facts.cpu - free.cpu), max(0.0, facts.memory - free.memory), node.name))
    shape = _shape(facts)
    if slots_ever == 0:
        wanted = ", ".join(f"{k}={v}" for k, v in job.constraint.items() if k != "pool")
        matched = f" that matches constraint {wanted}" if wanted else ""
        blockers.append(_item("node_size", f"no node in pool {pool}{matched} is large enough for one task ({shape})",
                              pool=pool, per_task=per_task, never=True,
                              **({"constraint": dict(job.constraint)} if wanted else {})))
        with_labels = f" with {wanted}" if wanted else ""
        if facts.tasks > 1:
            would.append(_if("larger_node", ADMIN, f"nodes{with_labels} for {facts.tasks} tasks of {shape} (the "
                             f"gang's) joining pool {pool}", pool=pool, per_task=per_task, tasks=facts.tasks))
        else:
            would.append(_if("larger_node", ADMIN, f"a node{with_labels} in pool {pool} holding {shape} joining",
                             pool=pool, per_task=per_task, tasks=1))
        would.append(_if("smaller_tasks", OWNER, "submitting it again with smaller tasks"
                         + (" or another --constraint" if wanted else ""), per_task=per_task))
        return True
    if facts.tasks > 1:
        if slots_ever < facts.tasks:
            blockers.append(_item("gang", f"gang of {facts.tasks} tasks × {shape}: the pool's nodes could hold at "
                                  f"most {slots_ever} such tasks even when idle; it can never start as asked",
                                  tasks=facts.tasks, per_task=per_task, nodes_holding_a_task_now=holders,
                                  tasks_room_now=slots_now, tasks_room_ever=slots_ever, never=True))
            would.append(_if("more_nodes", ADMIN, f"nodes for {facts.tasks - slots_ever} more tasks of {shape} "
                             f"joining pool {pool}", pool=pool, tasks=facts.tasks - slots_ever, per_task=per_task))
            would.append(_if("fewer_tasks", OWNER, f"submitting it again with at most {slots_ever} tasks (or "
                             f"--min-tasks {slots_ever})", tasks=slots_ever))
            return True
        if slots_now < facts.tasks:
            blockers.append(_item("gang", f"gang of {facts.tasks} tasks × {shape}: {holders} nodes could hold a task "
                                  f"now, with room for {slots_now} of the {facts.tasks} tasks",
                                  tasks=facts.tasks, per_task=per_task, nodes_holding_a_task_now=holders,
                                  tasks_room_now=slots_now))
            if not never:
                would.append(_if("task_room", CLUSTER, f"room for {facts.tasks - slots_now} more tasks of {shape}, "
                                 "each on one node (jobs ending there)", pool=pool, tasks=facts.tasks - slots_now,
                                 per_task=per_task))
        return False
    if slots_now == 0 and short and not never:
        gpu_short, cpu_short, mem_short, name = min(short)
        parts = []
        if gpu_short > EPS:
            parts.append(_gpus(gpu_short))
        if cpu_short > EPS:
            parts.append(f"{cpu_short:g} CPUs")
        if mem_short > EPS:
            parts.append(f"{mem_short:g} GiB of memory")
        blockers.append(_item("node_room", f"no matching node has room for one task ({shape}); node {name} "
                              f"lacks {', '.join(parts)}", per_task=per_task, node=name,
                              short={"gpu": gpu_short, "cpu": cpu_short, "memory": mem_short}))
        would.append(_if("node_frees", CLUSTER, f"{' and '.join(parts)} freeing on node {name}", node=name,
                         gpu=gpu_short, cpu=cpu_short, memory=mem_short))
    return False


def _shape(facts: _Facts) -> str:
    gpu = _gpus(facts.gpu) if facts.gpu >= 1 or facts.gpu <= EPS else f"{facts.gpu:g} of a GPU"
    return f"{gpu}, {facts.cpu:g} CPUs, {facts.memory:g} GiB"


def _slots(free: Resources, shares: list[float], facts: _Facts) -> int:
    """How many tasks of the job fit in ``free`` (``shares``: each GPU's free share), by its scarcest resource."""
    counts = []
    if facts.whole:
        counts.append(math.floor(sum(1 for share in shares if share >= 1.0 - EPS) / facts.whole + EPS))
    elif facts.gpu > EPS:  # a fraction of one GPU: as many as each GPU's free share holds
        counts.append(sum(math.floor(share / facts.gpu + EPS) for share in shares))
    if facts.cpu > EPS:
        counts.append(math.floor(free.cpu / facts.cpu + EPS))
    if facts.memory > EPS:
        counts.append(math.floor(free.memory / facts.memory + EPS))
    return max(0, min(counts)) if counts else 1


def _used(cluster: Cluster) -> dict[str, Resources]:
    """What running tasks hold on each node."""
    used: dict[str, Resources] = {}
    for other in cluster.jobs.values():
        for run in other.runs:
            placement = run.placement
            if placement is not None:
                held = used.get(placement.node, Resources())
                used[placement.node] = held + Resources(placement.gpu_share * len(placement.gpu_index),
                                                        other.cpus, other.memory_gib)
    return used


def _gpu_free(cluster: Cluster, node: str, gpus: int, out_of_service: tuple[int, ...]) -> list[float]:
    """The free share of each in-service GPU of the node."""
    held = [0.0] * gpus
    for other in cluster.jobs.values():
        for run in other.runs:
            placement = run.placement
            if placement is not None and placement.node == node:
                for index in placement.gpu_index:
                    if 0 <= index < gpus:
                        held[index] += placement.gpu_share
    return [max(0.0, 1.0 - share) for index, share in enumerate(held) if index not in out_of_service]
