"""``GET /api/v1/usage`` (decayed usage and standing, as sshare) and ``GET /api/v1/report`` (as sreport).

Departments and projects are shown to every user, as ``/api/v1/projects``
shows their quotas and use; user rows, and the jobs a report counts, are an
admin's to see in full: others see their own alone.
"""

from __future__ import annotations

import asyncio
import math
import time

from aiohttp import web

from gpud import jsontext
from gpud.accounting.report import GROUPINGS, report_rows
from gpud.accounting.standing import usage_rows
from gpud.controller.api import ApiError, ok
from gpud.controller.keys import CONTROLLER, PRINCIPAL
from gpud.jobs import Job
from gpud.lifecycle import PENDING, RUNNING

MAX_REPORT_JOBS = 1_000_000


async def usage(request: web.Request) -> web.Response:
    """Each department, project and user with its quota, fair share, decayed usage and standing."""
    ctrl, principal = request.app[CONTROLLER], request[PRINCIPAL]
    query = request.query
    pool, project, user = query.get("pool"), query.get("project"), query.get("user")
    if user is not None and not principal.admin and user != principal.user:
        raise ApiError(403, f"user {principal.user!r} may see only their own usage; another user's is for admins")
    plan = await ctrl.plan_for_views()
    fair = {(q.kind, q.pool, q.name): q.fair_share.gpu for q in (plan.queues if plan is not None else ())}
    pools = {ctrl.policy.default_pool} | set(ctrl.policy.pools) | {n.pool for n in ctrl.cluster.nodes.values()}
    rows = usage_rows(ctrl.policy, ctrl.charger.amounts(), fair, pools)
    known_pools = sorted({row["pool"] for row in rows})
    if pool is not None and pool not in known_pools:
        raise ApiError(404, f"no node pool {pool!r} has nodes, a policy entry or usage "
                            f"(pools: {', '.join(known_pools)})", field="pool")
    if project is not None and not any(row["project"] == project for row in rows):
        known = sorted(ctrl.policy.projects)
        raise ApiError(404, f"no project {project!r} in the policy or with usage (projects: {', '.join(known)})",
                       field="project")
    shown = []
    for row in rows:
        if pool is not None and row["pool"] != pool:
            continue
        if project is not None and row["project"] != project and not (
                row["level"] == "department" and ctrl.charger.department_of(project) == row["name"]):
            continue
        if row["level"] == "user" and ((user is not None and row["user"] != user)
                                       or (not principal.admin and row["user"] != principal.user)):
            continue
        if user is not None and row["level"] == "project" and not _has_user(rows, row, user):
            continue
        shown.append(row)
    if user is not None:  # only the departments of the projects the user has usage in
        kept = {(row["pool"], row["department"]) for row in shown if row["level"] == "project"}
        shown = [row for row in shown if row["level"] != "department" or (row["pool"], row["name"]) in kept]
    policy = ctrl.policy
    return ok({"rows": shown, "half_life_s": policy.usage_half_life_s, "reset": policy.usage_reset,
               "charged_at": ctrl.charger.as_of})


def _has_user(rows: list[dict], project_row: dict, user: str) -> bool:
    return any(r["level"] == "user" and r["pool"] == project_row["pool"] and r["project"] == project_row["name"]
               and r["user"] == user for r in rows)


async def report(request: web.Request) -> web.Response:
    """GPU-hours, CPU-hours, jobs, waits and GPU efficiency over a window, grouped by ``by``."""
    ctrl, principal = request.app[CONTROLLER], request[PRINCIPAL]
    query = request.query
    now = time.time()
    by = query.get("by", "user")
    if by not in GROUPINGS:
        raise ApiError(422, f"by must be one of {', '.join(GROUPINGS)}, not {by!r}", field="by")
    try:
        since = float(query.get("since", now - 30 * 86400))
        until = float(query.get("until", math.inf))
    except ValueError:
        raise ApiError(400, "since and until must be Unix times") from None
    if math.isnan(since) or math.isnan(until) or not math.isfinite(since):
        raise ApiError(422, "since must be a finite Unix time and until a Unix time", field="since")
    if until <= since:
        raise ApiError(422, "until must be after since", field="until")
    records = await asyncio.get_running_loop().run_in_executor(
        ctrl.store_executor, ctrl.usage_store.ended_between, since, min(until, 1e18))
    if len(records) > MAX_REPORT_JOBS:
        raise ApiError(422, f"the window holds {len(records)} jobs, more than {MAX_REPORT_JOBS}: narrow it")
    jobs = [Job.from_record(jsontext.loads(r)) for r in records]
    if until > now:
        # Running jobs, and requeued ones waiting again: both have used GPUs (and may have lost work).
        jobs += [job.copy() for job in ctrl.cluster.jobs.values()
                 if job.state == RUNNING or (job.state == PENDING and (job.gpu_seconds or job.lost_gpu_seconds))]
    for name, wanted in (("user", query.get("user")), ("project", query.get("project"))):
        if wanted is not None:
            jobs = [job for job in jobs if getattr(job, name) == wanted]
    if not principal.admin:
        jobs = [job for job in jobs if job.user == principal.user]
    rows = report_rows(jobs, by, now, ctrl.charger.department_of)
    return ok({"by": by, "since": since, "until": None if math.isinf(until) else until, "rows": rows})


def add_routes(app: web.Application) -> None:
    """Register the usage and report endpoints."""
    app.router.add_get("/api/v1/usage", usage)
    app.router.add_get("/api/v1/report", report)
