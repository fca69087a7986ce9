"""Words and JSON for the scheduler's reasons: made from the data of a plan (``Waiting``, ``Blocker``,
``Evicted``) when someone reads them, never parsed back."""

from __future__ import annotations

from typing import Iterator, Mapping

from gpud.core.blockers import (CONSTRAINT, EVICTED, FRAGMENTED_RULE, GANG, LIMIT, NO_NODES, NO_OVER_QUOTA,
                                NODE_SIZE, NOT_CONSIDERED, PREEMPT_OVER, PREEMPT_SHARE, QUOTA, RUNNING_JOBS, SHORTAGE,
                                UNKNOWN_PROJECT, USER_GPUS)
from gpud.core.queues import UNIT, UNITS, amount_text, format_amount
from gpud.model import Blocker, Evicted, OverLevel, Plan, QueueReport, Resources, TaskRequest, Waiting

INF = float("inf")
# Rules no amount of free capacity gets past: the job cannot run as asked.
NEVER_FITS = frozenset({NO_NODES, CONSTRAINT, NODE_SIZE})


def waiting_text(waiting: Waiting) -> str:
    """Why a job waits, for people: its queue's standing, then its blocker."""
    return "; ".join(waiting_clauses(waiting))


def waiting_clauses(waiting: Waiting) -> tuple[str, ...]:
    """Why a job waits as separate clauses: its queue's standing (when it has a queue), then its blocker."""
    clauses = [queue_text(waiting.queue)] if waiting.queue is not None else []
    if waiting.blocker is not None:
        clauses.append(blocker_text(waiting.blocker))
    return tuple(clause for clause in clauses if clause)


def queue_text(queue: QueueReport) -> str:
    """A queue's GPUs against its quota and fair share: ``project vision: 6/4 GPUs of quota (fair share 5.5)``."""
    return (f"{queue.kind} {queue.name}: {format_amount(queue.allocated.gpu)}/{format_amount(queue.quota.gpu)} "
            f"GPUs of quota (fair share {format_amount(queue.fair_share.gpu)})")


def blocker_text(b: Blocker) -> str:
    """One blocker, for people."""
    if b.runs:
        inner = _rule_text(b)
        return f"runs {b.runs} of its {b.of_tasks} tasks; the others wait: {inner}"
    text = _rule_text(b)
    return "cannot run as asked: " + text if b.rule in NEVER_FITS else text


def _rule_text(b: Blocker) -> str:
    rule = b.rule
    where = f"pool {b.pool}" + (" on matching nodes" if b.selector else "")
    if rule == SHORTAGE:
        return (f"waiting for {'GPUs' if b.resource == 'gpu' else 'CPUs'}: {where} has "
                f"{format_amount(max(b.free, 0.0))} free, the job needs {format_amount(b.need.get(b.resource))}")
    if rule == GANG:
        return (f"waiting for gang members: {where} has {format_amount(b.free)} GPUs free, but not "
                f"{b.tasks} tasks of {request_text(b.request)} at once ({_nodes(b.nodes_now)} could hold one now)")
    if rule == FRAGMENTED_RULE:
        return (f"fragmented: {where} has {format_amount(b.free)} GPUs free, but no node holds "
                f"{request_text(b.request)}")
    if rule == NO_NODES:
        return f"no schedulable nodes in pool {b.pool}"
    if rule == CONSTRAINT:
        wanted = ",".join(f"{k}={v}" for k, v in b.selector)
        return f"no node in pool {b.pool} matches constraint {wanted}"
    if rule == NODE_SIZE:
        wanted = ",".join(f"{k}={v}" for k, v in b.selector)
        return (f"no node in pool {b.pool}" + (f" that matches constraint {wanted}" if wanted else "")
                + f" is large enough for one task ({request_text(b.request)})")
    if rule == LIMIT:
        return (f"{b.level} {b.name} is at its limit of {_amounts(b.bound, b.need)} "
                f"(holds {_held(b.held, b.bound, b.need)})")
    if rule == QUOTA:
        return (f"{b.level} {b.name} has no quota left for it (non-preemptible jobs hold "
                f"{_held(b.held, b.bound, b.need)}; they run only within quota)")
    if rule == NO_OVER_QUOTA:
        return f"{b.level} {b.name} may not go over quota ({_held(b.held, b.bound, b.need)})"
    if rule == PREEMPT_SHARE:
        holds = ", ".join(amount_text(b.held.get(r), b.bound, r) for r in b.over)
        needs = ", ".join(f"{format_amount(b.need.get(r))} {UNIT[r] if b.need.get(r) == 1 else UNITS[r]}"
                          for r in b.over)
        return (f"preempting lower-priority jobs cannot keep {b.level} {b.name} within "
                f"its fair share (it holds {holds}; the job needs {needs})")
    if rule == PREEMPT_OVER:
        return (f"preempting lower-priority jobs would take {b.level} {b.name} to "
                f"{amount_text(b.held.get(b.resource), b.bound, b.resource)}, over its fair share")
    if rule == RUNNING_JOBS:
        if b.level == "project":
            return f"project {b.name} runs its limit of {_jobs(b.most)} at once"
        if b.level == "member":
            project, _, user = b.name.partition("/")
            return f"user {user} runs {_jobs(b.jobs)} in project {project}, the limit per user there ({b.most})"
        return f"user {b.name} runs {_jobs(b.jobs)}, the limit per user ({b.most})"
    if rule == USER_GPUS:
        held, cap, need = format_amount(b.held.gpu), format_amount(b.bound.gpu), format_amount(b.need.gpu)
        if b.level == "member":
            project, _, user = b.name.partition("/")
            return (f"user {user} holds {held} GPUs in project {project}; with {need} more they would pass the "
                    f"limit per user there ({cap})")
        return f"user {b.name} holds {held} GPUs; with {need} more they would pass the limit per user ({cap})"
    if rule == UNKNOWN_PROJECT:
        return f"project {b.name} is not in the policy"
    if rule == NOT_CONSIDERED:
        return "not considered this cycle"
    if rule == EVICTED:
        return "evicted this cycle" + (f": {eviction_text(b.evicted)}" if b.evicted is not None else "")
    return rule


def _jobs(count: int) -> str:
    return f"{count} job" if count == 1 else f"{count} jobs"


def eviction_text(e: Evicted) -> str:
    """Why tasks were evicted, for people: the rule, the queues or jobs and the numbers."""
    if e.rule == "preempt":
        return (f"preempt: job {e.for_job} (priority {e.priority}) of project {e.project} "
                f"outranks job {e.victim} (priority {e.victim_priority})")
    if e.rule == "reclaim":
        over = "; ".join(_over_text(level) for level in e.over)
        return (f"reclaim: {over}; for job {e.for_job} of project {e.project} "
                f"{format_amount(e.after)}/{format_amount(e.fair_share)} {UNITS[e.resource]}")
    if e.rule == "consolidate":
        return f"consolidate: moved to make room on node {e.node} for job {e.for_job}"
    return e.rule


def _over_text(level: OverLevel) -> str:
    return (f"{level.kind} {level.name} {format_amount(level.held)}/{format_amount(level.level)} "
            f"{UNITS[level.resource]} over {'fair share' if level.fair else 'quota'}")


def request_text(request: TaskRequest | None) -> str:
    """One task's request, for people: ``2 GPUs, 4 CPUs, 16 GiB``."""
    if request is None:
        return "one task"
    if request.gpu_memory_gib is not None:
        gpu = f"{format_amount(request.gpu_memory_gib)} GiB of one GPU"
    elif request.is_shared:
        gpu = f"{format_amount(request.gpus)} of a GPU"
    elif request.gpus:
        gpu = f"{format_amount(request.gpus)} GPUs"
    else:
        gpu = "no GPU"
    return f"{gpu}, {format_amount(request.cpus)} CPUs, {format_amount(request.memory_gib)} GiB"


def _nodes(count: int) -> str:
    return f"{count} node" + ("" if count == 1 else "s")


def _held(held: Resources, level: Resources, need: Resources) -> str:
    parts = []
    for name, unit in (("gpu", "GPUs"), ("cpu", "CPUs"), ("memory", "GiB")):
        if need.get(name) > 0 and level.get(name) != INF:
            parts.append(f"{format_amount(held.get(name))}/{format_amount(level.get(name))} {unit}")
    return ", ".join(parts)


def _amounts(level: Resources, need: Resources) -> str:
    parts = []
    for name, unit in (("gpu", "GPUs"), ("cpu", "CPUs"), ("memory", "GiB")):
        if need.get(name) > 0 and level.get(name) != INF:
            parts.append(f"{format_amount(level.get(name))} {unit}")
    return ", ".join(parts)


def blocker_data(b: Blocker) -> dict:
    """A blocker as JSON: its rule and the fields that rule sets (amounts as {gpu, cpu, memory})."""
    data: dict = {"rule": b.rule}
    for name in ("pool", "level", "name", "resource"):
        value = getattr(b, name)
        if value:
            data[name] = value
    if b.rule in (SHORTAGE, GANG, FRAGMENTED_RULE):
        data["free"] = _number(b.free)
    for name in ("need", "held", "bound"):
        amount: Resources = getattr(b, name)
        if amount != Resources():
            data[name] = _resources(amount)
    if b.over:
        data["over"] = list(b.over)
    if b.tasks:
        data["tasks"] = b.tasks
    if b.request is not None:
        r = b.request
        data["per_task"] = {"gpus": r.gpus, "gpu_memory_gib": r.gpu_memory_gib, "cpus": r.cpus,
                            "memory_gib": r.memory_gib}
    if b.nodes_now >= 0:
        data["nodes_holding_a_task_now"] = b.nodes_now
    if b.selector:
        data["constraint"] = dict(b.selector)
    if b.evicted is not None:
        data["evicted"] = eviction_data(b.evicted)
    if b.runs:
        data["runs"] = b.runs
        data["of_tasks"] = b.of_tasks
    if b.rule == RUNNING_JOBS:
        data["jobs"] = b.jobs
        data["most"] = b.most
    data["message"] = blocker_text(b)
    return data


def eviction_data(e: Evicted) -> dict:
    """An eviction's reason as JSON: its rule and the fields that rule sets, and its words."""
    data: dict = {"rule": e.rule, "for_job": e.for_job}
    if e.rule == "preempt":
        data.update(project=e.project, priority=e.priority, victim=e.victim, victim_priority=e.victim_priority)
    elif e.rule == "reclaim":
        data.update(project=e.project, resource=e.resource, after=_number(e.after),
                    fair_share=_number(e.fair_share),
                    over=[{"kind": o.kind, "name": o.name, "resource": o.resource, "held": _number(o.held),
                           "level": _number(o.level), "over": "fair_share" if o.fair else "quota"} for o in e.over])
    elif e.rule == "consolidate":
        data["node"] = e.node
    data["message"] = eviction_text(e)
    return data


def _number(value: float) -> float | None:
    """A number as JSON holds it: unlimited as null."""
    return None if value == INF else round(value, 6)


def _resources(amount: Resources) -> dict:
    return {"gpu": _number(amount.gpu), "cpu": _number(amount.cpu), "memory": _number(amount.memory)}


class PendingTexts(Mapping[str, str]):
    """A plan's pending reasons as words, each made when read."""

    def __init__(self, pending: Mapping[str, Waiting]) -> None:
        self._pending = pending

    def __getitem__(self, job_id: str) -> str:
        return waiting_text(self._pending[job_id])

    def __iter__(self) -> Iterator[str]:
        return iter(self._pending)

    def __len__(self) -> int:
        return len(self._pending)


def pending_texts(plan: Plan) -> Mapping[str, str]:
    """Why each job of the plan waits, in words, made when read."""
    return PendingTexts(plan.pending)
