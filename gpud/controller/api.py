"""The REST handlers for gpuctl (docs/api.md): each parses, calls the controller, and answers JSON."""

from __future__ import annotations

import asyncio
import contextlib
import math
import json
from typing import Any

from aiohttp import web

from gpud import jsontext
from gpud.controller import arrays, job_list
from gpud.controller.auth import Principal, digest, new_token, token_id
from gpud.controller.body import BodyError, parse_json, read_body
from gpud.controller.job_reason import recorded
from gpud.controller.job_events import with_submitted_event
from gpud.controller.idempotency import BadKey, Claim, KeyReused, fingerprint, request_key
from gpud.controller.keys import CONTROLLER, PRINCIPAL
from gpud.controller.persist import StoreError
from gpud.controller.policy_change import removed_projects
from gpud.controller.service import Controller
from gpud.controller.submits import SubmitRefused
from gpud.controller.views import JOB_VIEW_FIELDS, job_view, node_view, public_view, queue_view, redact
from gpud.controller.why import explain
from gpud.errors import ConfigError
from gpud.jobs import Job
from gpud.lifecycle import ACTIVE, RUNNING, STATES
from gpud.store.base import TokenRecord
from gpud.submission import DEV_NULL, is_job_id

MAX_BATCH = 10_000
MAX_HISTORY = 10_000
MAX_OFFSET = 1 << 62
CHANGE_SLICE = 200
VIEW_SLICE = 250           # job views made between two turns of the event loop
PARSE_ASIDE_BYTES = 64 * 1024  # a body this long or longer is parsed in a thread, not on the event loop
LOG_CHUNK = 256 * 1024
RECENTLY_ENDED_S = 300.0     # finished jobs stay in the queue listing this long, as with Slurm's MinJobAge


class ApiError(web.HTTPException):
    """An error answered as ``{"error": ...}`` with its status; ``job`` says the message names that job."""

    def __init__(self, status: int, message: str, **extra: Any) -> None:
        self.status_code = status
        super().__init__(text=json.dumps({"error": message, **extra}), content_type="application/json")


def ok(data: Any, status: int = 200) -> web.Response:
    """A JSON answer."""
    return web.Response(text=json.dumps(data), status=status, content_type="application/json")


async def read_json(request: web.Request) -> Any:
    """The request's JSON body, within the bounds of gpud/controller/body.py; 4xx naming the problem otherwise."""
    data = await body_bytes(request)
    try:
        if len(data) < PARSE_ASIDE_BYTES:
            return parse_json(data)
        # A batch of 2,000 jobs takes 30 ms to check and parse: the loop answers others meanwhile.
        return await asyncio.get_running_loop().run_in_executor(None, parse_json, data)
    except BodyError as exc:
        raise ApiError(exc.status, str(exc)) from None


async def body_bytes(request: web.Request) -> bytes:
    """The request's body, refused (413, 408) past the configured size or time."""
    config = request.app[CONTROLLER].config
    try:
        return await read_body(request, int(config.max_body_mib * 1024 * 1024), config.body_timeout_s)
    except BodyError as exc:
        raise ApiError(exc.status, str(exc)) from None


def require_admin(principal: Principal) -> None:
    """403 unless the caller is an admin."""
    if not principal.admin:
        raise ApiError(403, f"user {principal.user!r} is not an admin; this needs an admin token")


def may_see(principal: Principal, job: Job) -> bool:
    """True when the caller may see the job's command, environment and paths: its owner and admins."""
    return principal.admin or job.user == principal.user


def visible(principal: Principal, job: Job, view: dict) -> dict:
    """The job's view for this caller: all of it for its owner and admins, its public fields for others."""
    return view if may_see(principal, job) else public_view(view, job)


def owned(principal: Principal, job: Job) -> None:
    """403 unless the caller submitted the job or is an admin."""
    if not principal.admin and job.user != principal.user:
        raise ApiError(403, f"job {job.id} belongs to {job.user}; you ({principal.user}) may only change "
                            f"your own jobs", job=job.id)


async def submitted(ctrl: Controller, principal: Principal, payloads: list[Any], claim: Claim | None = None,
                    single: bool = False) -> web.Response:
    """The answer to a submit (gpud.controller.submits): 201 naming the jobs' ids, or the refusal."""
    try:
        return ok(await ctrl.submits.submit(principal, payloads, claim, single), 201)
    except SubmitRefused as exc:
        extra: dict[str, Any] = {"field": exc.field} if exc.field else {}
        if exc.index is not None:
            extra["index"] = exc.index
        refusal = ApiError(exc.status, str(exc), **extra)
        if exc.retry_after_s is not None:
            refusal.headers["Retry-After"] = str(max(1, round(exc.retry_after_s + 0.5)))
        raise refusal from None


async def idempotent(request: web.Request, work: Any) -> web.StreamResponse:
    """Run ``work(claim)`` once per Idempotency-Key (see gpud/controller/idempotency.py); plain when none given."""
    try:
        key = request_key(request.headers)
    except BadKey as exc:
        raise ApiError(400, str(exc), field="Idempotency-Key") from None
    if key is None:
        return await work(None)
    ctrl, principal = request.app[CONTROLLER], request[PRINCIPAL]
    body = await body_bytes(request)
    try:
        return await ctrl.idempotency.once(principal.user, key, fingerprint(request.method, request.path, body),
                                           work)
    except KeyReused as exc:
        raise ApiError(422, str(exc), field="Idempotency-Key") from None


async def submit(request: web.Request) -> web.StreamResponse:
    ctrl, principal = request.app[CONTROLLER], request[PRINCIPAL]

    async def work(claim: Claim | None) -> web.Response:
        payload = await read_json(request)
        return await submitted(ctrl, principal, [payload], claim, single=True)
    return await idempotent(request, work)


async def submit_batch(request: web.Request) -> web.StreamResponse:
    ctrl, principal = request.app[CONTROLLER], request[PRINCIPAL]

    async def work(claim: Claim | None) -> web.Response:
        body = await read_json(request)
        if not isinstance(body, dict) or not isinstance(body.get("jobs"), list) or set(body) != {"jobs"}:
            raise ApiError(400, 'a batch is {"jobs": [job, ...]}')
        if not body["jobs"] or len(body["jobs"]) > MAX_BATCH:
            raise ApiError(422, f"a batch holds 1 to {MAX_BATCH} jobs, not {len(body['jobs'])}")
        return await submitted(ctrl, principal, body["jobs"], claim)
    return await idempotent(request, work)


async def list_jobs(request: web.Request) -> web.Response:
    ctrl, principal = request.app[CONTROLLER], request[PRINCIPAL]
    query = request.query
    states = _states(query.get("state"))
    if states is None:
        states = set(STATES) if query.get("all") in ("1", "true") else set(ACTIVE)
    user, project = query.get("user"), query.get("project")
    try:
        limit = int(query.get("limit", str(job_list.DEFAULT_LIMIT)))
    except ValueError:
        raise ApiError(400, "limit must be an integer", field="limit") from None
    if not 1 <= limit <= job_list.MAX_LIMIT:
        raise ApiError(422, f"limit must be 1 to {job_list.MAX_LIMIT}, not {limit}", field="limit")
    try:
        after = job_list.decode_cursor(query["cursor"]) if "cursor" in query else None
    except job_list.CursorError as exc:
        raise ApiError(400, str(exc), field="cursor") from None
    shown = _fields(query.get("fields"))
    now = ctrl.clock()

    def decode_ended() -> list[Job]:  # read and decoded in the store's thread, off the event loop
        records = ctrl.store.history(since=now - RECENTLY_ENDED_S, user=user, project=project, limit=10_000)
        return [Job.from_record(jsontext.loads(r)) for r in records]

    async def read_ended() -> list[Job]:
        await written(ctrl)
        return await asyncio.get_running_loop().run_in_executor(ctrl.store_executor, decode_ended)

    page, last = await job_list.select_page(ctrl.cluster.job_service.listing, read_ended if states - ACTIVE else None,
                                            states, user, project, after, limit)
    jobs = []
    for start in range(0, len(page), VIEW_SLICE):
        for job in page[start:start + VIEW_SLICE]:
            active = job.id in ctrl.cluster.jobs
            reason = ctrl.cluster.waits.reason(job) if active else recorded(job.reason)
            view = job_view(job, reason, ctrl.cluster.nodes, now, ctrl.cluster.policy.time_slicing)
            jobs.append(visible(principal, job, {**view, **ctrl.cluster.waits.start_of(job)} if active else view))
        await asyncio.sleep(0)
    listed = await arrays.listed_arrays(ctrl, jobs)
    if shown is not None:
        jobs = [{key: value for key, value in job.items() if key in shown} for job in jobs]
    answer = {"jobs": jobs, "arrays": listed, "next_cursor": job_list.encode_cursor(last) if last is not None else None}
    return web.Response(text=jsontext.dumps(answer), content_type="application/json")


async def show_job(request: web.Request) -> web.Response:
    ctrl = request.app[CONTROLLER]
    elements = await arrays.array_elements(ctrl, request.match_info["id"])
    if elements:
        now = ctrl.clock()
        base = job_view(elements[0], ctrl.cluster.waits.reason(elements[0]), ctrl.cluster.nodes, now,
                        ctrl.cluster.policy.time_slicing)
        view = {**arrays.array_view(base, elements, ctrl.cluster, now), "events": []}
        return ok(visible(request[PRINCIPAL], elements[0], view))
    job = await find_job(ctrl, request.match_info["id"])
    view = job_view(job, ctrl.cluster.waits.reason(job), ctrl.cluster.nodes, ctrl.clock(),
                    ctrl.cluster.policy.time_slicing)
    view.update(ctrl.cluster.waits.start_of(job))
    loop = asyncio.get_running_loop()
    events = with_submitted_event(job, await loop.run_in_executor(ctrl.store_executor, ctrl.store.events, job.id))
    view["events"] = [{"time": e.time, "kind": e.kind, "message": e.message, "node": e.node} for e in events]
    return ok(visible(request[PRINCIPAL], job, view))


async def why_job(request: web.Request) -> web.Response:
    ctrl = request.app[CONTROLLER]
    elements = await arrays.array_elements(ctrl, request.match_info["id"])
    if elements:
        job = arrays.first_waiting(elements)
        answer = {**explain(job, ctrl.cluster), "element": job.id,
                  "array": arrays.summary(request.match_info["id"], elements, ctrl.cluster)}
    else:
        job = await find_job(ctrl, request.match_info["id"])
        answer = explain(job, ctrl.cluster)
    if not may_see(request[PRINCIPAL], job):
        answer["reason"] = redact(answer.get("reason"), job)
    return ok(answer)


async def change_jobs(request: web.Request) -> web.Response:
    ctrl, principal = request.app[CONTROLLER], request[PRINCIPAL]
    job_id, verb = request.match_info["id"], request.match_info["verb"]
    if not is_job_id(job_id):
        raise ApiError(404, f"no job {job_id!r}: job ids look like 42 or 42_7", job=job_id)
    jobs = ctrl.cluster.job_service.select(job_id)
    if not jobs:
        if ctrl.store_executor and await _stored(ctrl, job_id) is not None:
            raise ApiError(409, f"job {job_id} has already ended", job=job_id)
        elements = await arrays.array_elements(ctrl, job_id)
        if not elements:
            raise ApiError(404, f"no job {job_id}", job=job_id)
        for job in elements:
            owned(principal, job)
        summary = arrays.summary(job_id, elements, ctrl.cluster)
        counts = ", ".join(f"{n} {state.lower()}" for state, n in summary["states"].items())
        if verb != "cancel":
            raise ApiError(409, f"array {job_id} has ended ({counts}); {ONLY[verb]}", job=job_id)
        return ok({"ids": [], "ended": True, "array": summary})
    for job in jobs:
        owned(principal, job)
    changed: list[str] = []
    # In slices, each made durable before the next: a 100,000-element array never holds the event loop long.
    for start in range(0, len(jobs), CHANGE_SLICE):
        changed.extend(ctrl.cluster.job_service.change_many(jobs[start:start + CHANGE_SLICE], verb, principal.user))
        await ctrl.commit()
    if not changed and verb != "cancel":
        raise ApiError(409, f"job {job_id} {_unchanged(jobs[0], verb)}; {ONLY[verb]}", job=job_id)
    return web.Response(text=jsontext.dumps({"ids": changed}), content_type="application/json")


# Which jobs each verb changes, for a refusal that changed none.
ONLY = {"hold": "only a pending job can be held", "release": "only a held job can be released",
        "requeue": "only a running job can be requeued"}


def _unchanged(job: Job, verb: str) -> str:
    """What the job is that the verb did not change it."""
    if verb == "release":
        return "is not held"
    if verb == "requeue" and job.state == RUNNING:
        return "was submitted with --no-requeue: it is never requeued"
    return f"is {job.state.lower()}"


async def history(request: web.Request) -> web.Response:
    ctrl, principal = request.app[CONTROLLER], request[PRINCIPAL]
    query = request.query
    try:
        since = float(query["since"]) if "since" in query else None
        limit = int(query.get("limit", "100"))
    except ValueError:
        raise ApiError(400, "since must be a Unix time and limit an integer") from None
    if since is not None and not math.isfinite(since):
        raise ApiError(422, "since must be a finite Unix time", field="since")
    if not 1 <= limit <= MAX_HISTORY:
        raise ApiError(422, f"limit must be 1 to {MAX_HISTORY}, not {limit}", field="limit")
    await written(ctrl)

    def decode() -> list[Job]:  # read and decoded in the store's thread: 10,000 jobs take seconds to decode
        records = ctrl.store.history(since=since, user=query.get("user"), project=query.get("project"), limit=limit)
        return [Job.from_record(jsontext.loads(r)) for r in records]

    ended = await asyncio.get_running_loop().run_in_executor(ctrl.store_executor, decode)
    now = ctrl.clock()
    jobs = []
    for start in range(0, len(ended), VIEW_SLICE):
        jobs += [visible(principal, job, job_view(job, recorded(job.reason), ctrl.cluster.nodes, now,
                                                  ctrl.cluster.policy.time_slicing))
                 for job in ended[start:start + VIEW_SLICE]]
        await asyncio.sleep(0)
    return web.Response(text=jsontext.dumps({"jobs": jobs}), content_type="application/json")


async def list_nodes(request: web.Request) -> web.Response:
    ctrl = request.app[CONTROLLER]
    now = ctrl.clock()
    used, held = gpu_use(ctrl), host_use(ctrl)
    return ok({"nodes": [node_view(node, used.get(name, {}), bool(ctrl.cluster.runs.wanted.get(name)), now,
                                   held.get(name, (0.0, 0.0)))
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


def host_use(ctrl: Controller) -> dict[str, tuple[float, float]]:
    """The CPUs and GiB of memory held per node, from the placed tasks' requests."""
    held: dict[str, tuple[float, float]] = {}
    for job in ctrl.cluster.jobs.values():
        for run in job.runs:
            if run.placement is not None:
                cpus, memory = held.get(run.placement.node, (0.0, 0.0))
                held[run.placement.node] = (cpus + job.cpus, memory + job.memory_gib)
    return held


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
        ctrl.cluster.node_messages.drain(node, reason.strip(), principal.user)
    else:
        ctrl.cluster.node_messages.resume(node, principal.user)
    await ctrl.commit()
    return ok(node_view(node, gpu_use(ctrl).get(name, {}), bool(ctrl.cluster.runs.wanted.get(name)), ctrl.clock(),
                        host_use(ctrl).get(name, (0.0, 0.0))))


async def projects(request: web.Request) -> web.Response:
    ctrl = request.app[CONTROLLER]
    plan = await ctrl.plan_for_views()
    counts: dict[tuple[str, str], list[int]] = {}
    for job in ctrl.cluster.jobs.values():
        pool = job.pool or ctrl.policy.default_pool
        entry = counts.setdefault((job.project, pool), [0, 0])
        entry[0 if job.state == "PENDING" else 1] += 1
    queues = []
    for queue in (plan.queues if plan is not None else ()):
        pending, running = (counts.get((queue.name, queue.pool), [0, 0]) if queue.kind == "project"
                            else department_counts(ctrl, counts, queue))
        queues.append(queue_view(queue, pending, running))
    return ok({"queues": queues})


def department_counts(ctrl: Controller, counts: dict, queue: Any) -> list[int]:
    """[pending, running] jobs of the projects of department ``queue`` in its pool, summed."""
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
    if not body["user"].isascii() and not _valid_unicode(body["user"]):
        raise ApiError(400, "user must be valid Unicode text (it holds a lone surrogate)", field="user")
    admin, allow_root = body.get("admin", False), body.get("allow_root", False)
    if not isinstance(admin, bool) or not isinstance(allow_root, bool) or set(body) - {"user", "admin", "allow_root"}:
        raise ApiError(422, "admin and allow_root must be true or false, and only user, admin and allow_root "
                            "are known fields")
    token = new_token()
    record = TokenRecord(digest(token), body["user"].strip(), admin, ctrl.clock(), allow_root=allow_root)
    ctrl.persist.token(record)
    await ctrl.commit()
    ctrl.auth.add(record)
    return ok({"user": record.user, "admin": admin, "allow_root": allow_root, "token": token,
               "id": token_id(record.hash)}, 201)


async def whoami(request: web.Request) -> web.Response:
    principal = request[PRINCIPAL]
    return ok({"user": principal.user, "admin": principal.admin})


async def job_logs(request: web.Request) -> web.StreamResponse:
    ctrl, principal = request.app[CONTROLLER], request[PRINCIPAL]
    query = request.query
    try:
        task = int(query.get("task", "0"))
        offset = int(query.get("offset", "0"))
    except ValueError:
        raise ApiError(400, "task and offset must be integers") from None
    stream, follow = query.get("stream", "out"), query.get("follow") in ("1", "true")
    elements = await arrays.array_elements(ctrl, request.match_info["id"])
    if elements:
        return await _array_logs(request, elements, stream, follow)
    job = await find_job(ctrl, request.match_info["id"])
    owned(principal, job)
    if stream not in ("out", "err") or not 0 <= task < job.tasks or not 0 <= offset <= MAX_OFFSET:
        raise ApiError(422, f"stream is out or err, task 0 to {job.tasks - 1}, offset at least 0")
    if (job.output if stream == "out" or not job.error else job.error) == DEV_NULL:
        raise ApiError(409, f"job {job.id} sends its {'output' if stream == 'out' else 'errors'} to {DEV_NULL}, "
                            f"so there is no log to show")
    response = None
    if not log_node(job, task):
        if not follow or job.state != "PENDING":
            raise ApiError(409, f"job {job.id} task {task} has not run yet, so it has no log"
                                + (" (gpuctl logs -f waits for it to start)" if job.state == "PENDING" else ""))
        # Followed before it starts: answer now (so the client does not time out), then wait for the start.
        response = web.StreamResponse(headers={"Content-Type": "text/plain; charset=utf-8"})
        await response.prepare(request)
        while True:
            current = ctrl.cluster.jobs.get(job.id)
            if current is None or log_node(current, task) or _gone(request):
                break
            await asyncio.sleep(0.5)
        if current is None or _gone(request):  # ended (cancelled) before it ran, or the reader left
            return await _end(response)
        job = current
    return await _copy_log(request, ctrl, job, task, stream, offset, follow, response)


def _gone(request: web.Request) -> bool:
    """Whether the reader went away (Ctrl-C of gpuctl logs -f)."""
    return request.transport is None or request.transport.is_closing()


def log_node(job: Job, task: int) -> str:
    """The node holding the task's log: where it runs, else where it last ran; empty when it never ran."""
    placement = job.runs[task].placement
    return placement.node if placement else (job.hosts[task] if task < len(job.hosts) else "")


def log_path(job: Job, task: int, stream: str) -> str:
    """The path of the task's ``out`` or ``err`` file on its node, with %j and %t filled in."""
    pattern = job.output if stream == "out" or not job.error else job.error
    return job.workdir.rstrip("/") + "/" + pattern.replace("%j", job.id).replace("%t", str(task))


async def _end(response: web.StreamResponse) -> web.StreamResponse:
    try:
        await response.write_eof()
    except ConnectionError:
        pass
    return response


async def _copy_log(request: web.Request, ctrl: Controller, job: Job, task: int, stream: str, offset: int,
                    follow: bool, response: web.StreamResponse | None) -> web.StreamResponse:
    """Stream the task's log from its node; with ``follow``, until the job stops running.

    Errors become HTTP errors while nothing is sent yet; after that the
    stream just ends.
    """
    node, path = log_node(job, task), log_path(job, task, stream)
    while True:
        try:
            chunk = await ctrl.read_log(node, job.id, task, path, offset, LOG_CHUNK, job.user)
        except LookupError as exc:
            if response is None:
                raise ApiError(503, f"{exc}; the log is on {node} at {path}") from None
            break
        except asyncio.TimeoutError:
            if response is None:
                raise ApiError(504, f"node {node} did not answer; the log is on {node} at {path}") from None
            break
        if chunk.get("error"):
            if response is None:
                raise ApiError(403, f"node {node}: {chunk['error']} ({path})")
            break
        if response is None:
            if chunk.get("missing") and not follow:
                raise ApiError(404, f"no log file yet on {node} at {path}")
            response = web.StreamResponse(headers={"Content-Type": "text/plain; charset=utf-8",
                                                   "X-Gpud-Node": node, "X-Gpud-Path": path})
            await response.prepare(request)
        data = chunk.get("data", "")
        if data:
            try:
                await response.write(data.encode())
            except ConnectionError:  # the reader went away (Ctrl-C of gpuctl logs -f): nothing to report
                return response
            offset = int(chunk.get("offset", offset + len(data.encode())))
            continue
        current = ctrl.cluster.jobs.get(job.id)
        if not follow or current is None or current.state != "RUNNING" or _gone(request):
            break
        await asyncio.sleep(0.5)
    return await _end(response)


async def _array_logs(request: web.Request, elements: list[Job], stream: str,
                      follow: bool) -> web.StreamResponse:
    """Every element's log (task 0) one after the other, each under a ``==> 42_3 <==`` line, as tail prints files."""
    ctrl, principal = request.app[CONTROLLER], request[PRINCIPAL]
    array_id = request.match_info["id"]
    for job in elements:
        owned(principal, job)
    if stream not in ("out", "err"):
        raise ApiError(422, "stream is out or err")
    if follow:
        running = [job.id for job in elements if job.state == "RUNNING"]
        raise ApiError(422, f"job {array_id} is an array of {len(elements)} jobs: follow one of them, e.g. "
                            f"gpuctl logs -f {(running or [elements[0].id])[0]}")
    response = web.StreamResponse(headers={"Content-Type": "text/plain; charset=utf-8"})
    await response.prepare(request)
    try:
        for job in elements:
            node = log_node(job, 0)
            if not node:
                continue
            await response.write(f"==> {job.id} ({job.state.lower()}) <==\n".encode())
            offset = 0
            while True:
                try:
                    chunk = await ctrl.read_log(node, job.id, 0, log_path(job, 0, stream), offset, LOG_CHUNK,
                                                job.user)
                except (LookupError, asyncio.TimeoutError):
                    chunk = {"error": f"node {node} is not connected"}
                if chunk.get("error") or chunk.get("missing"):
                    await response.write(f"(no log: {chunk.get('error') or 'no file yet'})\n".encode())
                    break
                data = chunk.get("data", "")
                if not data:
                    break
                await response.write(data.encode())
                offset = int(chunk.get("offset", offset + len(data.encode())))
    except ConnectionError:
        return response
    return await _end(response)


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


async def written(ctrl: Controller) -> None:
    """Return once what the controller has done so far is in the store, so that a read of the store sees it.

    A job that ends leaves the active jobs at once and reaches the store
    with the next batch; a read in between would find it nowhere. A batch
    the store refused is no reason to refuse the read: it sees what is there.
    """
    with contextlib.suppress(StoreError):
        await ctrl.persist.flush()


async def _stored(ctrl: Controller, job_id: str) -> str | None:
    await written(ctrl)
    loop = asyncio.get_running_loop()
    return await loop.run_in_executor(ctrl.store_executor, ctrl.store.job, job_id)


def _valid_unicode(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _fields(text: str | None) -> frozenset[str] | None:
    """The job fields a listing's ``fields`` names (each job then carries only those it has); None: every field."""
    if text is None:
        return None
    names = frozenset(name.strip() for name in text.split(",") if name.strip())
    if not names:
        raise ApiError(422, "fields must name at least one job field", field="fields")
    unknown = names - JOB_VIEW_FIELDS
    if unknown:
        raise ApiError(422, f"unknown job field {sorted(unknown)[0]!r} in fields; fields: {', '.join(sorted(JOB_VIEW_FIELDS))}",
                       field="fields")
    return names


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
    app.router.add_post("/api/v1/jobs/{id}/{verb:cancel|hold|release|requeue}", change_jobs)
    app.router.add_get("/api/v1/history", history)
    app.router.add_get("/api/v1/nodes", list_nodes)
    app.router.add_post("/api/v1/nodes/{name}/{verb:drain|resume}", change_node)
    app.router.add_get("/api/v1/projects", projects)
    app.router.add_post("/api/v1/policy/reload", reload_policy)
    app.router.add_post("/api/v1/tokens", create_token)
    app.router.add_get("/api/v1/whoami", whoami)
