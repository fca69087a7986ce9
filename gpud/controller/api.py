"""The REST handlers for gpuctl (docs/api.md): each parses, calls the controller, and answers JSON."""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

from aiohttp import web

from gpud import jsontext
from gpud.controller.auth import Principal, digest, new_token
from gpud.controller.cluster import with_submitted_event
from gpud.controller.keys import CONTROLLER, PRINCIPAL
from gpud.controller.policy_change import removed_projects
from gpud.controller.service import Controller
from gpud.controller.views import job_view, node_view, queue_view
from gpud.controller.why import explain
from gpud.errors import ConfigError
from gpud.jobs import Job
from gpud.lifecycle import ACTIVE, STATES
from gpud.submission import DEV_NULL, SubmitError, check_job, is_job_id

MAX_BATCH = 10_000
LOG_CHUNK = 256 * 1024
RECENTLY_ENDED_S = 300.0     # finished jobs stay in the queue listing this long, as with Slurm's MinJobAge


class ApiError(web.HTTPException):
    """An error answered as ``{"error": ...}`` with its status."""

    def __init__(self, status: int, message: str, **extra: Any) -> None:
        self.status_code = status
        super().__init__(text=json.dumps({"error": message, **extra}), content_type="application/json")


def ok(data: Any, status: int = 200) -> web.Response:
    """A JSON answer."""
    return web.Response(text=json.dumps(data), status=status, content_type="application/json")


async def read_json(request: web.Request) -> Any:
    """The request's JSON body; 400 naming the problem when it is not JSON."""
    try:
        return json.loads(await request.read())
    except (ValueError, UnicodeDecodeError) as exc:
        raise ApiError(400, f"the body is not valid JSON: {exc}") from None
    except RecursionError:
        raise ApiError(400, "the body is not valid JSON: it is nested too deeply") from None


def require_admin(principal: Principal) -> None:
    """403 unless the caller is an admin."""
    if not principal.admin:
        raise ApiError(403, f"user {principal.user!r} is not an admin; this needs an admin token")


def owned(principal: Principal, job: Job) -> None:
    """403 unless the caller submitted the job or is an admin."""
    if not principal.admin and job.user != principal.user:
        raise ApiError(403, f"job {job.id} belongs to {job.user}; you ({principal.user}) may only change "
                            f"your own jobs")


async def submit_many(ctrl: Controller, principal: Principal, payloads: list[Any]) -> list[str]:
    """Check every job, then accept them all (durably) or none."""
    cap = ctrl.cluster.largest_node()
    submissions = []
    for index, payload in enumerate(payloads):
        try:
            submissions.append(check_job(payload, user=principal.user, admin=principal.admin,
                                         policy=ctrl.policy, capacity=cap))
        except SubmitError as exc:
            extra = {"field": exc.field} if exc.field else {}
            if len(payloads) > 1:
                extra["index"] = index
            raise ApiError(exc.status, str(exc), **extra) from None
    targets = sorted({d.job for s in submissions for d in s.job.depends})
    unknown = ctrl.cluster.unknown_dependencies(targets)
    finished: dict[str, str] = {}
    if unknown:
        loop = asyncio.get_running_loop()
        finished = await loop.run_in_executor(ctrl.store_executor, ctrl.store.jobs_state, unknown)
        missing = [t for t in unknown if t not in finished]
        if missing:
            raise ApiError(422, f"depends on unknown job {missing[0]}", field="depends")
    ids = ctrl.cluster.submit(submissions, finished)
    await ctrl.commit()
    return ids


async def submit(request: web.Request) -> web.Response:
    ctrl, principal = request.app[CONTROLLER], request[PRINCIPAL]
    ids = await submit_many(ctrl, principal, [await read_json(request)])
    answer: dict[str, Any] = {"ids": ids}
    if ids and "_" in ids[0]:
        answer["array_id"] = ids[0].partition("_")[0]
    return ok(answer, 201)


async def submit_batch(request: web.Request) -> web.Response:
    ctrl, principal = request.app[CONTROLLER], request[PRINCIPAL]
    body = await read_json(request)
    if not isinstance(body, dict) or not isinstance(body.get("jobs"), list) or set(body) != {"jobs"}:
        raise ApiError(400, 'a batch is {"jobs": [job, ...]}')
    if not body["jobs"] or len(body["jobs"]) > MAX_BATCH:
        raise ApiError(422, f"a batch holds 1 to {MAX_BATCH} jobs, not {len(body['jobs'])}")
    return ok({"ids": await submit_many(ctrl, principal, body["jobs"])}, 201)


async def list_jobs(request: web.Request) -> web.Response:
    ctrl = request.app[CONTROLLER]
    query = request.query
    states = _states(query.get("state"))
    if states is None:
        states = set(STATES) if query.get("all") in ("1", "true") else set(ACTIVE)
    user, project = query.get("user"), query.get("project")
    now = time.time()
    jobs = [job_view(job, ctrl.cluster.reason_of(job), ctrl.cluster.nodes, now,
                     ctrl.cluster.policy.time_slicing)
            for job in ctrl.cluster.jobs.values()
            if job.state in states and (user is None or job.user == user)
            and (project is None or job.project == project)]
    if states - ACTIVE:
        loop = asyncio.get_running_loop()
        records = await loop.run_in_executor(ctrl.store_executor, lambda: ctrl.store.history(
            since=now - RECENTLY_ENDED_S, user=user, project=project, limit=10_000))
        for job in (Job.from_record(jsontext.loads(r)) for r in records):
            if job.state in states:
                jobs.append(job_view(job, job.reason, ctrl.cluster.nodes, now,
                                     ctrl.cluster.policy.time_slicing))
    jobs.sort(key=lambda j: (j["submitted"], j["id"]))
    return ok({"jobs": jobs})


async def show_job(request: web.Request) -> web.Response:
    ctrl = request.app[CONTROLLER]
    job = await find_job(ctrl, request.match_info["id"])
    view = job_view(job, ctrl.cluster.reason_of(job), ctrl.cluster.nodes, time.time(),
                    ctrl.cluster.policy.time_slicing)
    loop = asyncio.get_running_loop()
    events = with_submitted_event(job, await loop.run_in_executor(ctrl.store_executor, ctrl.store.events, job.id))
    view["events"] = [{"time": e.time, "kind": e.kind, "message": e.message, "node": e.node} for e in events]
    return ok(view)


async def why_job(request: web.Request) -> web.Response:
    ctrl = request.app[CONTROLLER]
    job = await find_job(ctrl, request.match_info["id"])
    return ok(explain(job, ctrl.cluster))


async def change_jobs(request: web.Request) -> web.Response:
    ctrl, principal = request.app[CONTROLLER], request[PRINCIPAL]
    job_id, verb = request.match_info["id"], request.match_info["verb"]
    if not is_job_id(job_id):
        raise ApiError(404, f"no job {job_id!r}: job ids look like 42 or 42_7")
    jobs = ctrl.cluster.select(job_id)
    if not jobs:
        if ctrl.store_executor and await _stored(ctrl, job_id) is not None:
            raise ApiError(409, f"job {job_id} has already ended")
        raise ApiError(404, f"no job {job_id}")
    for job in jobs:
        owned(principal, job)
    changed = []
    for job in jobs:
        if verb == "cancel":
            ctrl.cluster.cancel(job, principal.user)
            changed.append(job.id)
        elif verb == "hold" and ctrl.cluster.hold(job, principal.user):
            changed.append(job.id)
        elif verb == "release" and ctrl.cluster.release(job, principal.user):
            changed.append(job.id)
    await ctrl.commit()
    if not changed and verb != "cancel":
        state = "held" if verb == "hold" else "not held"
        raise ApiError(409, f"job {job_id} is {jobs[0].state.lower() if verb == 'hold' else state}; "
                            f"only a pending job can be {'held' if verb == 'hold' else 'released'}")
    return ok({"ids": changed})


async def history(request: web.Request) -> web.Response:
    ctrl = request.app[CONTROLLER]
    query = request.query
    try:
        since = float(query["since"]) if "since" in query else None
        limit = min(int(query.get("limit", "100")), 10_000)
    except ValueError:
        raise ApiError(400, "since must be a Unix time and limit an integer") from None
    loop = asyncio.get_running_loop()
    records = await loop.run_in_executor(
        ctrl.store_executor, lambda: ctrl.store.history(since=since, user=query.get("user"),
                                                        project=query.get("project"), limit=limit))
    now = time.time()
    jobs = [job_view(job, job.reason, ctrl.cluster.nodes, now,
                     ctrl.cluster.policy.time_slicing)
            for job in (Job.from_record(jsontext.loads(r)) for r in records)]
    return ok({"jobs": jobs})


async def list_nodes(request: web.Request) -> web.Response:
    ctrl = request.app[CONTROLLER]
    now = time.time()
    used = gpu_use(ctrl)
    return ok({"nodes": [node_view(node, used.get(name, {}), bool(ctrl.cluster.wanted.get(name)), now)
                         for name, node in sorted(ctrl.cluster.nodes.items())]})


def gpu_use(ctrl: Controller) -> dict[str, dict[int, float]]:
    """The share of each GPU in use, per node, from the running jobs' placements."""
    used: dict[str, dict[int, float]] = {}
    for job in ctrl.cluster.jobs.values():
        for run in job.runs:
            p = run.placement
            if p is not None:
                per_node = used.setdefault(p.node, {})
                for index in p.gpu_index:
                    per_node[index] = per_node.get(index, 0.0) + p.gpu_share
    return used


async def change_node(request: web.Request) -> web.Response:
    ctrl, principal = request.app[CONTROLLER], request[PRINCIPAL]
    require_admin(principal)
    name, verb = request.match_info["name"], request.match_info["verb"]
    node = ctrl.cluster.nodes.get(name)
    if node is None:
        raise ApiError(404, f"no node {name!r}; nodes: {', '.join(sorted(ctrl.cluster.nodes)) or 'none'}")
    if verb == "drain":
        body = await read_json(request) if request.can_read_body else {}
        reason = body.get("reason") if isinstance(body, dict) else None
        if not isinstance(reason, str) or not reason.strip():
            raise ApiError(422, "say why the node is drained: {\"reason\": \"...\"}", field="reason")
        ctrl.cluster.drain(node, reason.strip(), principal.user)
    else:
        ctrl.cluster.resume(node, principal.user)
    await ctrl.commit()
    return ok(node_view(node, gpu_use(ctrl).get(name, {}), bool(ctrl.cluster.wanted.get(name)), time.time()))


async def projects(request: web.Request) -> web.Response:
    ctrl = request.app[CONTROLLER]
    plan = ctrl.cluster.last_plan
    counts: dict[tuple[str, str], list[int]] = {}
    for job in ctrl.cluster.jobs.values():
        pool = job.pool or ctrl.policy.default_pool
        entry = counts.setdefault((job.project, pool), [0, 0])
        entry[0 if job.state == "PENDING" else 1] += 1
    queues = []
    for queue in (plan.queues if plan is not None else ()):
        pending, running = (counts.get((queue.name, queue.pool), [0, 0]) if queue.kind == "project"
                            else _department_counts(ctrl, counts, queue))
        queues.append(queue_view(queue, pending, running))
    return ok({"queues": queues})


def _department_counts(ctrl: Controller, counts: dict, queue: Any) -> list[int]:
    total = [0, 0]
    for (project, pool), (pending, running) in counts.items():
        known = ctrl.policy.projects.get(project)
        if pool == queue.pool and known is not None and known.department == queue.name:
            total[0] += pending
            total[1] += running
    return total


async def reload_policy(request: web.Request) -> web.Response:
    ctrl, principal = request.app[CONTROLLER], request[PRINCIPAL]
    require_admin(principal)
    old = ctrl.policy
    try:
        policy = ctrl.reload_policy()
    except ConfigError as exc:
        raise ApiError(422, f"policy refused, the old one stays: {exc}") from None
    return ok({"ok": True, "projects": len(policy.projects), "departments": len(policy.departments),
               "removed_projects": removed_projects(old, policy, ctrl.cluster.jobs.values())})


async def create_token(request: web.Request) -> web.Response:
    ctrl, principal = request.app[CONTROLLER], request[PRINCIPAL]
    require_admin(principal)
    body = await read_json(request)
    if not isinstance(body, dict) or not isinstance(body.get("user"), str) or not body["user"].strip():
        raise ApiError(422, 'say whose token: {"user": "alice", "admin": false}', field="user")
    admin = body.get("admin", False)
    if not isinstance(admin, bool) or set(body) - {"user", "admin"}:
        raise ApiError(422, "admin must be true or false, and only user and admin are known fields")
    token = new_token()
    ctrl.persist.token(digest(token), body["user"].strip(), admin, time.time())
    await ctrl.commit()
    ctrl.auth.add(digest(token), body["user"].strip(), admin)
    return ok({"user": body["user"].strip(), "admin": admin, "token": token}, 201)


async def whoami(request: web.Request) -> web.Response:
    principal = request[PRINCIPAL]
    return ok({"user": principal.user, "admin": principal.admin})


async def job_logs(request: web.Request) -> web.StreamResponse:
    ctrl = request.app[CONTROLLER]
    job = await find_job(ctrl, request.match_info["id"])
    principal = request[PRINCIPAL]
    owned(principal, job)
    query = request.query
    try:
        task = int(query.get("task", "0"))
        offset = int(query.get("offset", "0"))
    except ValueError:
        raise ApiError(400, "task and offset must be integers") from None
    stream = query.get("stream", "out")
    if stream not in ("out", "err") or not 0 <= task < job.tasks or offset < 0:
        raise ApiError(422, f"stream is out or err, task 0 to {job.tasks - 1}, offset at least 0")
    node = job.runs[task].placement.node if job.runs[task].placement else (
        job.hosts[task] if task < len(job.hosts) else "")
    if not node:
        raise ApiError(409, f"job {job.id} task {task} has not run yet, so it has no log")
    pattern = job.output if stream == "out" or not job.error else job.error
    if pattern == DEV_NULL:
        raise ApiError(409, f"job {job.id} sends its {'output' if stream == 'out' else 'errors'} to {DEV_NULL}, "
                            f"so there is no log to show")
    path = job.workdir.rstrip("/") + "/" + pattern.replace("%j", job.id).replace("%t", str(task))
    follow = query.get("follow") in ("1", "true")
    response = web.StreamResponse(headers={"Content-Type": "text/plain; charset=utf-8", "X-Gpud-Node": node,
                                           "X-Gpud-Path": path})
    first = True
    while True:
        try:
            chunk = await ctrl.read_log(node, job.id, task, path, offset, LOG_CHUNK, job.user)
        except LookupError as exc:
            if first:
                raise ApiError(503, f"{exc}; the log is on {node} at {path}") from None
            break
        except asyncio.TimeoutError:
            if first:
                raise ApiError(504, f"node {node} did not answer; the log is on {node} at {path}") from None
            break
        if chunk.get("error"):
            raise ApiError(403, f"node {node}: {chunk['error']} ({path})")
        if first:
            if chunk.get("missing") and not follow:
                raise ApiError(404, f"no log file yet on {node} at {path}")
            await response.prepare(request)
            first = False
        data = chunk.get("data", "")
        if data:
            await response.write(data.encode())
            offset = int(chunk.get("offset", offset + len(data.encode())))
            continue
        current = ctrl.cluster.jobs.get(job.id)
        if not follow or current is None or current.state != "RUNNING":
            break
        await asyncio.sleep(0.5)
    await response.write_eof()
    return response


async def find_job(ctrl: Controller, job_id: str) -> Job:
    """The job, active or finished; 404 when unknown."""
    if not is_job_id(job_id):
        raise ApiError(404, f"no job {job_id!r}: job ids look like 42 or 42_7")
    job = ctrl.cluster.jobs.get(job_id)
    if job is not None:
        return job
    record = await _stored(ctrl, job_id)
    if record is None:
        raise ApiError(404, f"no job {job_id}")
    return Job.from_record(jsontext.loads(record))


async def _stored(ctrl: Controller, job_id: str) -> str | None:
    loop = asyncio.get_running_loop()
    return await loop.run_in_executor(ctrl.store_executor, ctrl.store.job, job_id)


def _states(text: str | None) -> set[str] | None:
    if not text:
        return None
    states = {s.strip().upper() for s in text.split(",") if s.strip()}
    unknown = states - set(STATES)
    if unknown:
        raise ApiError(422, f"unknown state {sorted(unknown)[0]}; states: {', '.join(STATES)}")
    return states


def add_routes(app: web.Application) -> None:
    """Register the user and admin endpoints."""
    app.router.add_post("/api/v1/jobs", submit)
    app.router.add_post("/api/v1/jobs/batch", submit_batch)
    app.router.add_get("/api/v1/jobs", list_jobs)
    app.router.add_get("/api/v1/jobs/{id}", show_job)
    app.router.add_get("/api/v1/jobs/{id}/why", why_job)
    app.router.add_get("/api/v1/jobs/{id}/logs", job_logs)
    app.router.add_post("/api/v1/jobs/{id}/{verb:cancel|hold|release}", change_jobs)
    app.router.add_get("/api/v1/history", history)
    app.router.add_get("/api/v1/nodes", list_nodes)
    app.router.add_post("/api/v1/nodes/{name}/{verb:drain|resume}", change_node)
    app.router.add_get("/api/v1/projects", projects)
    app.router.add_post("/api/v1/policy/reload", reload_policy)
    app.router.add_post("/api/v1/tokens", create_token)
    app.router.add_get("/api/v1/whoami", whoami)
