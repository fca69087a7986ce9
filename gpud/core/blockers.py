"""The rules a blocker names, and blockers made from others: a cycle makes thousands, few are read."""

from __future__ import annotations

from typing import Final

from gpud.model import EPS, RESOURCES, Blocker, Resources

NO_NODES: Final = "no_nodes"
CONSTRAINT: Final = "constraint"
NODE_SIZE: Final = "node_size"
SHORTAGE: Final = "shortage"
GANG: Final = "gang"
FRAGMENTED_RULE: Final = "fragmented"
LIMIT: Final = "limit"
QUOTA: Final = "quota"
NO_OVER_QUOTA: Final = "no_over_quota"
PREEMPT_SHARE: Final = "preempt_share"
PREEMPT_OVER: Final = "preempt_over"
UNKNOWN_PROJECT: Final = "unknown_project"
NOT_CONSIDERED: Final = "not_considered"
EVICTED: Final = "evicted"
RUNNING_JOBS: Final = "running_jobs"
USER_GPUS: Final = "user_gpus"


def restated(blocker: Blocker, need: Resources) -> Blocker:
    """The same blocker for a job needing ``need`` (a job of the same shape, more or fewer tasks)."""
    return _copy(blocker, need, blocker.over, blocker.runs, blocker.of_tasks)


def over_share(blocker: Blocker, need: Resources) -> Blocker:
    """A ``preempt_share`` blocker for a job needing ``need`` (one task), learnt from another job's: the
    resources it names are those in which the level, holding ``held``, would go over the larger of its
    fair share and what it holds, as the job's own try would name them (the learnt ones if none)."""
    b = blocker
    over = tuple(r for r in RESOURCES if b.held.get(r) + need.get(r) > max(b.bound.get(r), b.held.get(r)) + EPS)
    return _copy(b, need, over or b.over, b.runs, b.of_tasks)


def running(blocker: Blocker, runs: int, of_tasks: int) -> Blocker:
    """The blocker of a job that runs ``runs`` of its ``of_tasks`` tasks: why the others wait."""
    return _copy(blocker, blocker.need, blocker.over, runs, of_tasks)


def _copy(b: Blocker, need: Resources, over: tuple[str, ...], runs: int, of_tasks: int) -> Blocker:
    """``b`` with the need, the resources over and the running tasks given; every other field as it is.

    Made field by field rather than with ``dataclasses.replace``, which
    looks the fields up by name on every call: a cycle copies thousands.
    """
    return Blocker(b.rule, b.pool, b.level, b.name, b.resource, b.free, need, b.held, b.bound, over, b.tasks,
                   b.request, b.nodes_now, b.selector, b.evicted, runs, of_tasks, b.jobs, b.most)
