"""``POST /api/v1/jobs/{id}/checkpoints``: a job records that a complete checkpoint exists now.

Its tasks call it with their own checkpoint credential (GPUD_CHECKPOINT_TOKEN,
which opens this endpoint of this job and nothing else); the job's owner
and admins may call it with their tokens too.
"""

from __future__ import annotations

import time

from aiohttp import web

from gpud.controller.api import ApiError, find_job, ok, owned
from gpud.controller.auth import Principal, bearer
from gpud.controller.checkpoints import COMMAND, is_checkpoint_token, token_matches
from gpud.controller.keys import CONTROLLER, PRINCIPAL
from gpud.controller.service import Controller
from gpud.jobs import Job
from gpud.lifecycle import RUNNING

PATH = "/api/v1/jobs/{id}/checkpoints"


def checkpoint_principal(request: web.Request, header: str | None) -> Principal | None:
    """The caller a task's checkpoint credential stands for, on this endpoint of its own job alone; None
    for any other token, path or job."""
    token = bearer(header)
    if token is None or not is_checkpoint_token(token) or request.method != "POST":
        return None
    resource = request.match_info.route.resource
    if resource is None or resource.canonical != PATH:
        return None
    job = _victim_or_active(request.app[CONTROLLER], request.match_info.get("id", ""))
    if job is None or not token_matches(request.app[CONTROLLER].auth.cluster_key, job, token):
        return None
    return Principal(job.user, checkpoint_job=job.id)


async def record_checkpoint(request: web.Request) -> web.Response:
    """Record a checkpoint of a running job (or of a victim within its grace) as of now."""
    ctrl, principal = request.app[CONTROLLER], request[PRINCIPAL]
    job = _victim_or_active(ctrl, request.match_info["id"]) or await find_job(ctrl, request.match_info["id"])
    if principal.checkpoint_job is None:
        owned(principal, job)
    elif principal.checkpoint_job != job.id:
        raise ApiError(403, "this checkpoint credential is another job's")
    told = job.id in ctrl.cluster.plans.preemptions.told
    if job.state != RUNNING and not told:
        raise ApiError(409, f"job {job.id} is {job.state}: only a running job, or a preempted one within its "
                            f"grace, records checkpoints")
    at = time.time()
    ctrl.cluster.plans.checkpointed(job, at, COMMAND)
    await ctrl.commit()
    return ok({"job": job.id, "at": at, "checkpoints": len(job.checkpoints), "stopped_now": told}, 201)


def _victim_or_active(ctrl: Controller, job_id: str) -> Job | None:
    """The active job, or a victim within its grace (which may have ended: a job with ``--no-requeue``)."""
    return ctrl.cluster.jobs.get(job_id) or ctrl.cluster.plans.preemptions.victim(job_id)


def add_routes(app: web.Application) -> None:
    """Register the checkpoint endpoint."""
    app.router.add_post(PATH, record_checkpoint)
