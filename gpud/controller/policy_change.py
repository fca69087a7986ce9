"""What a new policy changes for the jobs already in the cluster, as data for the answer to a reload."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from gpud.jobs import Job
from gpud.lifecycle import PENDING, RUNNING
from gpud.policy import Policy


def removed_projects(old: Policy, new: Policy, jobs: Iterable[Job]) -> list[dict]:
    """Each project the old policy had and the new one has not, with its running and pending jobs.

    Such jobs stay: running ones run on until they end (their GPUs stay
    theirs), pending ones wait, with the reason "project P is not in the
    policy", until the project comes back or they are cancelled.
    """
    gone: dict[str, dict[str, Any]] = {name: {"project": name, "running": 0, "pending": 0} for name in old.projects if name not in new.projects}
    for job in jobs:
        entry = gone.get(job.project)
        if entry is not None and job.state in (RUNNING, PENDING):
            entry["running" if job.state == RUNNING else "pending"] += 1
    return [gone[name] for name in sorted(gone)]
