"""The policy's pending-job limits, checked at submission (as Slurm's MaxSubmitJobs)."""

from __future__ import annotations

from collections import Counter
from typing import Iterable

from gpud.jobs import Job
from gpud.lifecycle import PENDING
from gpud.policy import Policy
from gpud.submission import Submission


def pending_refusal(policy: Policy, jobs: Iterable[Job], submissions: list[Submission], user: str) -> str | None:
    """Why ``user`` may not submit these jobs: the pending limit they would pass, named; None when none.

    Counts the jobs now pending (of the user overall, of the user in each
    project, of each project) plus those submitted (each array element one).
    """
    user_limit = policy.user_limits.pending_jobs
    wanted: Counter[str] = Counter()
    for submission in submissions:
        wanted[submission.job.project] += len(submission.array_indices or (0,))
    limited = [p for p in wanted if policy.projects[p].user_limits.pending_jobs is not None
               or policy.projects[p].job_limits.pending_jobs is not None]
    if user_limit is None and not limited:
        return None
    mine: Counter[str] = Counter()  # the user's pending jobs by project
    projects: Counter[str] = Counter()
    for job in jobs:
        if job.state == PENDING:
            projects[job.project] += 1
            if job.user == user:
                mine[job.project] += 1
    for project in limited:
        settings = policy.projects[project]
        most = settings.user_limits.pending_jobs
        if most is not None and mine[project] + wanted[project] > most:
            return (f"user {user} may have at most {most} pending jobs in project {project} (user_pending_jobs); "
                    f"{mine[project]} wait there now and this submits {wanted[project]}")
        most = settings.job_limits.pending_jobs
        if most is not None and projects[project] + wanted[project] > most:
            return (f"project {project} may have at most {most} pending jobs (pending_jobs); {projects[project]} "
                    f"wait there now and this submits {wanted[project]}")
    if user_limit is not None:
        have, adding = sum(mine.values()), sum(wanted.values())
        if have + adding > user_limit:
            return (f"user {user} may have at most {user_limit} pending jobs ([limits] user_pending_jobs); "
                    f"{have} wait now and this submits {adding}")
    return None
