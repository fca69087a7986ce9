"""Per-user and per-project limits: GPUs a user holds at once, and running jobs, as the cycle goes."""

from __future__ import annotations

from typing import Final

from gpud.core.blockers import RUNNING_JOBS, USER_GPUS
from gpud.model import EPS, Blocker, JobSpec, Resources
from gpud.policy import Policy

# Whom a limit's refusal binds (as gpud.core.admission's): the job's user only, not others of its shape.
USER_ONLY: Final = 2
EVERY_JOB: Final = 0  # gpud.core.admission's


class LimitBook:
    """What each user and project holds now, kept as tasks start and stop: GPUs and running jobs.

    A job counts as running from its first task placed until its last one
    stops. GPUs and running jobs of a user count per project (over its
    pools) and over all projects.
    """

    __slots__ = ("policy", "running", "user_gpus", "user_running", "member_gpus", "member_running",
                 "project_running")

    def __init__(self, policy: Policy) -> None:
        self.policy = policy
        self.running: set[str] = set()  # the jobs that hold some task now
        self.user_gpus: dict[str, float] = {}
        self.user_running: dict[str, int] = {}
        self.member_gpus: dict[tuple[str, str], float] = {}  # by (project, user)
        self.member_running: dict[tuple[str, str], int] = {}
        self.project_running: dict[str, int] = {}

    def change(self, job: JobSpec, gpu: float, running: int) -> None:
        """Book ``gpu`` more GPUs for the job's user (negative: fewer), and ``running`` more running jobs
        (1 when its first task started, -1 when its last stopped, else 0)."""
        user, member = job.user, (job.project, job.user)
        self.user_gpus[user] = self.user_gpus.get(user, 0.0) + gpu
        self.member_gpus[member] = self.member_gpus.get(member, 0.0) + gpu
        if running:
            if running > 0:
                self.running.add(job.id)
            else:
                self.running.discard(job.id)
            self.user_running[user] = self.user_running.get(user, 0) + running
            self.member_running[member] = self.member_running.get(member, 0) + running
            self.project_running[job.project] = self.project_running.get(job.project, 0) + running

    def refusal(self, job: JobSpec, gpu: float, pool: str = "") -> tuple[Blocker, int] | None:
        """Why the job may not take ``gpu`` more GPUs (and become a running job, when none of its tasks
        runs), as a blocker, with whom the refusal binds (USER_ONLY, or EVERY_JOB of the project); None
        when no limit stops it."""
        policy, project = self.policy, job.project
        settings = policy.projects.get(project)
        if settings is None:
            return None
        user, member = job.user, (job.project, job.user)
        if job.id not in self.running:
            most = settings.job_limits.running_jobs
            running = self.project_running.get(project, 0)
            if most is not None and running >= most:
                return Blocker(RUNNING_JOBS, pool, "project", project, jobs=running, most=most), EVERY_JOB
            most = settings.user_limits.running_jobs
            running = self.member_running.get(member, 0)
            if most is not None and running >= most:
                return Blocker(RUNNING_JOBS, pool, "member", f"{project}/{user}", jobs=running, most=most), USER_ONLY
            most = policy.user_limits.running_jobs
            running = self.user_running.get(user, 0)
            if most is not None and running >= most:
                return Blocker(RUNNING_JOBS, pool, "user", user, jobs=running, most=most), USER_ONLY
        if gpu > EPS:
            cap = settings.user_limits.gpus
            held = self.member_gpus.get(member, 0.0)
            if cap is not None and held + gpu > cap + EPS:
                return Blocker(USER_GPUS, pool, "member", f"{project}/{user}", need=Resources(gpu=gpu),
                               held=Resources(gpu=held), bound=Resources(gpu=cap)), USER_ONLY
            cap = policy.user_limits.gpus
            held = self.user_gpus.get(user, 0.0)
            if cap is not None and held + gpu > cap + EPS:
                return Blocker(USER_GPUS, pool, "user", user, need=Resources(gpu=gpu), held=Resources(gpu=held),
                               bound=Resources(gpu=cap)), USER_ONLY
        return None
