"""What each page shows, built from the API's own views and visibility rules (gpud/controller/api.py).

Every job a page shows goes through ``api.visible``: other users' jobs
arrive without command, script, environment or paths, exactly as the API
answers them. Pages only add arrangement: grouping, paging, counting.
"""

from __future__ import annotations

import asyncio
import math
import time
from dataclasses import dataclass, field
from typing import Any

from gpud import jsontext
from gpud.accounting.report import report_rows
from gpud.controller import api, arrays
from gpud.controller.auth import Principal
from gpud.controller.job_events import with_submitted_event
from gpud.controller.service import Controller
from gpud.controller.views import job_view, node_view, queue_view, redact
from gpud.controller.why import explain
from gpud.jobs import Job
from gpud.lifecycle import ACTIVE, PENDING, RUNNING

PAGE_ROWS = 50
ARRAY_ROWS = 200     # elements listed under an expanded array row
DAY, WEEK = 86400.0, 7 * 86400.0


def view_of(ctrl: Controller, principal: Principal, job: Job, now: float) -> dict:
    """The job as the API shows it to ``principal``."""
    return api.visible(principal, job, {**job_view(job, ctrl.cluster.waits.reason(job), ctrl.cluster.nodes, now,
                                                   ctrl.cluster.policy.time_slicing), **ctrl.cluster.waits.start_of(job)})


@dataclass(slots=True)
class QueueRow:
    """One line of the queue: a job, or an array with its elements (shown when the row is expanded)."""

    id: str
    view: dict
    elements: list[dict] = field(default_factory=list)
    counts: dict[str, int] = field(default_factory=dict)
    size: int = 1


@dataclass(slots=True)
class QueuePage:
    """A page of the queue and what its filters can choose from."""

    rows: list[QueueRow]
    page: int
    pages: int
    total_rows: int
    total_jobs: int
    projects: list[str]
    users: list[str]


@dataclass(slots=True)
class QueueIndex:
    """The filtered active jobs grouped into rows (an array is one row), in queue order, and the filters' choices."""

    keys: list[str]
    groups: dict[str, list[Job]]
    jobs: int
    users: list[str]
    projects: list[str]


def queue_index(ctrl: Controller, states: frozenset[str], user: str | None, project: str | None) -> QueueIndex:
    """One pass over the controller's jobs: those that pass the filters, grouped and ordered by submit time."""
    groups: dict[str, list[Job]] = {}
    since: dict[str, float] = {}
    users: set[str] = set()
    projects: set[str] = set(ctrl.policy.projects)
    count = 0
    for job in ctrl.cluster.jobs.values():
        users.add(job.user)
        projects.add(job.project)
        if job.state not in states or (user is not None and job.user != user) or \
                (project is not None and job.project != project):
            continue
        count += 1
        key = job.array_id or job.id
        members = groups.get(key)
        if members is None:
            groups[key] = [job]
            since[key] = job.submitted
        else:
            members.append(job)
            if job.submitted < since[key]:
                since[key] = job.submitted
    for members in groups.values():
        if len(members) > 1:
            members.sort(key=lambda j: (j.array_index if j.array_index is not None else -1, j.id))
    # Jobs submitted together (a batch) keep the order of their ids: 9 before 10.
    keys = [key for *_, key in sorted((since[key], len(key), key) for key in groups)]
    return QueueIndex(keys, groups, count, sorted(users), sorted(projects))


def queue_page(ctrl: Controller, principal: Principal, project: str | None, user: str | None, state: str | None,
               page: int, cache: dict | None = None, version: object = None) -> QueuePage:
    """The active jobs that pass the filters, an array as one row, ``PAGE_ROWS`` rows a page (from 1).

    Only the rows of the page are turned into views, so a queue of 10,000
    jobs costs one pass and a sort, not 10,000 views. With ``cache`` (a
    dict the caller keeps) and the cluster's ``version``, the pass is made
    once per version and filter, however many pages ask.
    """
    states = frozenset({state}) if state in ACTIVE else ACTIVE
    wanted = (version, states, user, project)
    index = cache.get(wanted) if cache is not None and version is not None else None
    if index is None:
        index = queue_index(ctrl, states, user, project)
        if cache is not None and version is not None:
            if len(cache) >= 16 or any(key[0] != version for key in cache):
                cache.clear()
            cache[wanted] = index
    pages = max(1, math.ceil(len(index.keys) / PAGE_ROWS))
    page = min(max(1, page), pages)
    now = time.time()
    rows = []
    for key in index.keys[(page - 1) * PAGE_ROWS:page * PAGE_ROWS]:
        members = index.groups[key]
        first = next((j for j in members if j.state == PENDING), members[0])
        if members[0].array_id is None:
            rows.append(QueueRow(key, view_of(ctrl, principal, first, now)))
            continue
        rows.append(QueueRow(key, view_of(ctrl, principal, first, now),
                             [view_of(ctrl, principal, job, now) for job in members[:ARRAY_ROWS]],
                             arrays.state_counts(members), len(members)))
    return QueuePage(rows, page, pages, len(index.keys), index.jobs, index.projects, index.users)


async def job_page(ctrl: Controller, principal: Principal, job_id: str) -> dict[str, Any]:
    """A job (or an array) as ``gpuctl show`` and ``gpuctl why`` see it, for ``principal``; 404 when unknown."""
    now = time.time()
    elements = await arrays.array_elements(ctrl, job_id)
    if elements:
        base = job_view(elements[0], ctrl.cluster.waits.reason(elements[0]), ctrl.cluster.nodes, now,
                        ctrl.cluster.policy.time_slicing)
        view = api.visible(principal, elements[0], {**arrays.array_view(base, elements, ctrl.cluster, now),
                                                    "events": []})
        job = arrays.first_waiting(elements)
    else:
        job = await api.find_job(ctrl, job_id)
        view = job_view(job, ctrl.cluster.waits.reason(job), ctrl.cluster.nodes, now, ctrl.cluster.policy.time_slicing)
        view.update(ctrl.cluster.waits.start_of(job))
        loop = asyncio.get_running_loop()
        events = with_submitted_event(job, await loop.run_in_executor(ctrl.store_executor, ctrl.store.events, job.id))
        view["events"] = [{"time": e.time, "kind": e.kind, "message": e.message, "node": e.node} for e in events]
        view = api.visible(principal, job, view)
    why = explain(job, ctrl.cluster)
    if not api.may_see(principal, job):
        why["reason"] = redact(why.get("reason"), job)
        for item in (*why["blockers"], *why["would_start"]):
            item["message"] = redact(item.get("message"), job)
    return {"job": view, "why": why, "mine": api.may_see(principal, job), "array": bool(elements),
            "live": (ctrl.cluster.jobs.get(job.id) or job).state in ACTIVE}


def gpu_cells(ctrl: Controller) -> list[dict[str, Any]]:
    """Each pool with its nodes and each node's GPUs: allocated, idle, down or drained, and who holds them.

    A GPU's utilisation and memory are its jobs' sampled means and peaks,
    where their nodes sample them.
    """
    holders: dict[tuple[str, int], list[Job]] = {}
    for job in ctrl.cluster.jobs.values():
        for run in job.runs:
            if run.placement is not None:
                for index in run.placement.gpu_index:
                    holders.setdefault((run.placement.node, index), []).append(job)
    used, held = api.gpu_use(ctrl), api.host_use(ctrl)
    now = time.time()
    pools: dict[str, list[dict]] = {}
    for name, node in sorted(ctrl.cluster.nodes.items()):
        view = node_view(node, used.get(name, {}), bool(ctrl.cluster.runs.wanted.get(name)), now,
                         held.get(name, (0.0, 0.0)))
        for gpu in view["gpus"]:
            jobs = holders.get((name, gpu["index"]), [])
            samples = [j for j in jobs if j.gpu_util_samples]
            gpu["jobs"] = [{"id": j.id, "user": j.user, "project": j.project} for j in jobs]
            gpu["utilization"] = (sum(j.gpu_util_sum / j.gpu_util_samples for j in samples) / len(samples)
                                  if samples else None)
            peaks = [j.gpu_memory_peak_gib for j in jobs if j.gpu_memory_peak_gib is not None]
            gpu["memory_peak_gib"] = max(peaks) if peaks else None
            gpu["status"] = gpu_status(view["state"], gpu)
        pools.setdefault(node.pool, []).append(view)
    return [{"name": pool, "nodes": nodes} for pool, nodes in sorted(pools.items())]


def gpu_status(node_state: str, gpu: dict) -> str:
    """allocated, idle, down (node not up, or GPU unhealthy) or drained, for a GPU on a node in ``node_state``."""
    if node_state not in ("up", "draining", "drained") or not gpu["healthy"]:
        return "down"
    if gpu["used"] > 0:
        return "allocated"
    return "drained" if node_state in ("draining", "drained") else "idle"


def counts(pools: list[dict]) -> dict[str, int]:
    """How many GPUs are in each status, over every pool."""
    total = {"allocated": 0, "idle": 0, "down": 0, "drained": 0}
    for pool in pools:
        for node in pool["nodes"]:
            for gpu in node["gpus"]:
                total[gpu["status"]] += 1
    return total


def node_views(ctrl: Controller) -> list[dict]:
    """Every node as ``GET /api/v1/nodes`` shows it."""
    used, held = api.gpu_use(ctrl), api.host_use(ctrl)
    now = time.time()
    return [node_view(node, used.get(name, {}), bool(ctrl.cluster.runs.wanted.get(name)), now,
                      held.get(name, (0.0, 0.0)))
            for name, node in sorted(ctrl.cluster.nodes.items())]


def queues(ctrl: Controller) -> list[dict]:
    """Per pool, each department followed by its projects (then the projects of no department), as
    ``GET /api/v1/projects`` shows them."""
    plan = ctrl.cluster.last_plan
    counted: dict[tuple[str, str], list[int]] = {}
    for job in ctrl.cluster.jobs.values():
        entry = counted.setdefault((job.project, job.pool or ctrl.policy.default_pool), [0, 0])
        entry[0 if job.state == PENDING else 1] += 1
    views = []
    for queue in (plan.queues if plan is not None else ()):
        pending, running = (counted.get((queue.name, queue.pool), [0, 0]) if queue.kind == "project"
                            else api.department_counts(ctrl, counted, queue))
        views.append(queue_view(queue, pending, running))
    pools: dict[str, list[dict]] = {}
    for view in views:
        pools.setdefault(view["pool"], []).append(view)
    arranged = []
    for pool, members in sorted(pools.items()):
        ordered = []
        for department in (v for v in members if v["kind"] == "department"):
            ordered.append(department)
            ordered.extend(v for v in members if v["kind"] == "project" and v["department"] == department["name"])
        ordered.extend(v for v in members if v not in ordered)
        arranged.append({"name": pool, "queues": ordered})
    return arranged


async def usage_series(ctrl: Controller, now: float) -> dict[str, dict[str, list[float]]]:
    """GPU-hours per project over the last day (24 hours) and the last week (7 days).

    A job's GPU-seconds are spread evenly over the time it ran, so a job
    that ran across a boundary counts in both buckets.
    """
    loop = asyncio.get_running_loop()
    records = await loop.run_in_executor(ctrl.store_executor, ctrl.usage_store.ended_between, now - WEEK, now + 1)
    jobs = [Job.from_record(jsontext.loads(r)) for r in records]
    jobs += [job for job in ctrl.cluster.jobs.values() if job.state == RUNNING]
    series: dict[str, dict[str, list[float]]] = {}
    for job in jobs:
        if job.started is None:
            continue
        end = job.ended or now
        seconds = job.gpu_seconds + sum(max(0.0, now - run.since) * len(run.placement.gpu_index) *
                                        run.placement.gpu_share for run in job.runs
                                        if run.placement is not None and run.since)
        if seconds <= 0:
            continue
        rate = seconds / max(1.0, end - job.started)
        entry = series.setdefault(job.project, {"day": [0.0] * 24, "week": [0.0] * 7})
        for name, span, buckets in (("day", DAY, 24), ("week", WEEK, 7)):
            width = span / buckets
            for b in range(buckets):
                lo, hi = now - span + b * width, now - span + (b + 1) * width
                overlap = min(hi, end) - max(lo, job.started)
                if overlap > 0:
                    entry[name][b] += rate * overlap / 3600.0
    return series


async def report(ctrl: Controller, principal: Principal, by: str, window_s: float) -> list[dict]:
    """``GET /api/v1/report`` over the last ``window_s`` seconds: other users' jobs counted for admins only."""
    now = time.time()
    loop = asyncio.get_running_loop()
    records = await loop.run_in_executor(ctrl.store_executor, ctrl.usage_store.ended_between, now - window_s, 1e18)
    jobs = [Job.from_record(jsontext.loads(r)) for r in records]
    jobs += [job.copy() for job in ctrl.cluster.jobs.values() if job.state == RUNNING]
    if not principal.admin:
        jobs = [job for job in jobs if job.user == principal.user]
    return report_rows(jobs, by, now, ctrl.charger.department_of)
