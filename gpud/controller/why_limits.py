"""``gpuctl why``: the policy's limits per user and per project that hold a job back, as data."""

from __future__ import annotations

from gpud.controller.cluster import Cluster
from gpud.jobs import Job
from gpud.lifecycle import RUNNING
from gpud.model import EPS

OWNER = "owner"
PROJECT = "project"
ADMIN = "admin"


def limit_facts(job: Job, cluster: Cluster, want: float, blockers: list, would: list) -> bool:
    """Add a blocker (rule "user_limit" or "project_limit") for each limit the job would pass by starting
    (``want``: the GPUs of the tasks that must start together), with what would let it start; True when
    it never can (it needs more GPUs than a user may hold)."""
    policy = cluster.policy
    settings = policy.projects.get(job.project)
    if settings is None or not policy.has_limits:
        return False
    user, project = job.user, job.project
    user_running = member_running = project_running = 0
    user_gpus = member_gpus = 0.0
    for other in cluster.jobs.values():
        if other.state != RUNNING or other.id == job.id:
            continue
        mine, here = other.user == user, other.project == project
        held = sum(run.placement.gpu_share * len(run.placement.gpu_index) for run in other.runs
                   if run.placement is not None)
        if here:
            project_running += 1
        if mine:
            user_running += 1
            user_gpus += held
            if here:
                member_running += 1
                member_gpus += held
    never = False
    found: list = []  # this module's conditions: the job starts only once all of them hold
    most = settings.job_limits.running_jobs
    if most is not None and project_running >= most:
        blockers.append(_item("project_limit", f"project {project} runs {project_running} jobs, its limit "
                              f"(running_jobs = {most})", limit="running_jobs", project=project,
                              running=project_running, most=most))
        found.append(_if("project_runs_fewer", PROJECT, f"a job of project {project} ending (it may run {most} "
                         "at once), or an admin raising running_jobs", project=project, running_at_most=most - 1))
    for scope, most, running, key in (("in project " + project, settings.user_limits.running_jobs, member_running,
                                       "user_running_jobs"),
                                      ("over all projects", policy.user_limits.running_jobs, user_running,
                                       "[limits] user_running_jobs")):
        if most is not None and running >= most:
            blockers.append(_item("user_limit", f"user {user} runs {_jobs(running)} {scope}, the limit per user "
                                  f"({key} = {most})", limit=key, user=user, project=project,
                                  running=running, most=most))
            found.append(_if("user_runs_fewer", OWNER, f"one of {user}'s jobs {scope} ending (at most {most} "
                             "run at once)", user=user, running_at_most=most - 1))
    for scope, cap, held, key in (("in project " + project, settings.user_limits.gpus, member_gpus, "user_gpus"),
                                  ("over all projects", policy.user_limits.gpus, user_gpus, "[limits] user_gpus")):
        if cap is None or want <= EPS:
            continue
        if want > cap + EPS:
            never = True
            blockers.append(_item("user_limit", f"the job needs {want:g} GPUs, more than a user may hold {scope} "
                                  f"({key} = {cap:g}): it can never start as asked", limit=key, user=user,
                                  project=project, gpu_limit=cap, need=want, never=True))
            would.append(_if("user_limit_at_least", ADMIN, f"an admin raising {key} to at least {want:g} "
                             "(policy file)", limit=key, gpu=want))
        elif held + want > cap + EPS:
            blockers.append(_item("user_limit", f"user {user} holds {held:g} GPUs {scope}; with {want:g} more "
                                  f"they would pass the limit per user ({key} = {cap:g})", limit=key, user=user,
                                  project=project, held=held, gpu_limit=cap, need=want))
            found.append(_if("user_holds_at_most", OWNER, f"{user}'s jobs {scope} holding at most "
                             f"{_gpus(cap - want)} (they hold {held:g})", user=user, gpu=cap - want))
    if len(found) > 1:  # each alone would not start it
        who = PROJECT if any(c["who"] == PROJECT for c in found) else OWNER
        found = [_if("all_of", who, "; and ".join(c["message"] for c in found), conditions=found)]
    would.extend(found)
    return never


def _jobs(count: int) -> str:
    return f"{count} job" if count == 1 else f"{count} jobs"


def _gpus(amount: float) -> str:
    return f"{amount:g} GPU" if amount == 1 else f"{amount:g} GPUs"


def _item(rule: str, message: str, **data: object) -> dict:
    return {"rule": rule, **data, "message": message}


def _if(condition: str, who: str, message: str, **data: object) -> dict:
    return {"condition": condition, "who": who, **data, "message": message}
