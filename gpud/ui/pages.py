"""The dashboard's pages: each handler reads its query, asks gpud/ui/data.py, and renders a template.

A page's live part (its ``_*.html`` fragment) is made by ``section_text``
for both the htmx request and the event stream that pushes it.
"""

from __future__ import annotations

import asyncio
import csv
import io
import time
from typing import Any, Awaitable, Callable

from aiohttp import web
from multidict import MultiMapping
from yarl import URL

from gpud.accounting.report import GROUPINGS
from gpud.controller import api
from gpud.controller.auth import Principal
from gpud.controller.keys import CONTROLLER, PRINCIPAL
from gpud.lifecycle import ACTIVE
from gpud.submission import is_job_id
from gpud.ui import charts, data
from gpud.ui.app import LIVE, SESSION, SIGNER, render, render_text
from gpud.ui.live import ENDED, FRAGMENT_S
from gpud.ui.session import Session

WINDOWS = {"day": 86400.0, "week": 7 * 86400.0, "month": 30 * 86400.0}
USAGE_CACHE_S = 60.0
FRAGMENTS_KEPT = 256


class Section:
    """A page's live part as one stream or htmx request asks for it: the template, its values, whose it is,
    the page's path, and ``version()``, the version of the state it shows (``ENDED`` for what no longer
    changes)."""

    def __init__(self, template: str, who: tuple, values: Callable[[], Awaitable[dict[str, Any]]], path: str,
                 version: Callable[[], object]) -> None:
        self.template, self.who, self.values, self.path, self.version = template, who, values, path, version


def _choice(query: MultiMapping[str], key: str) -> str | None:
    value = query.get(key, "").strip()
    return value or None


def _queue_query(query: MultiMapping[str]) -> tuple[dict[str, str | None], int]:
    state = _choice(query, "state")
    if state is not None and state.upper() not in ACTIVE:
        raise api.ApiError(422, f"state is one of {', '.join(sorted(ACTIVE))}, not {state!r}")
    try:
        page = int(query.get("page", "1"))
    except ValueError:
        raise api.ApiError(400, "page must be a number") from None
    return {"project": _choice(query, "project"), "user": _choice(query, "user"),
            "state": state.upper() if state else None}, page


def section(app: web.Application, session: Session, principal: Principal, view: URL) -> Section | None:
    """The live part of the page at ``view`` (a path and query under /ui/) for this user; None when it has none.

    ``who`` holds everything besides the cluster and the query that the
    fragment depends on: nothing for the overview's public fields, the user
    and whether an admin for what the API's visibility rules decide, and
    the session's nonce where the fragment carries a form (its CSRF token).
    """
    ctrl, cluster_version = app[CONTROLLER], app[LIVE].version
    path = view.path
    if path == "/ui/":
        async def overview_values() -> dict[str, Any]:
            pools = data.gpu_cells(ctrl)
            jobs = {"pending": 0, "running": 0}
            for job in ctrl.cluster.jobs.values():
                jobs["pending" if job.state == "PENDING" else "running"] += 1
            return {"pools": pools, "counts": data.counts(pools), "jobs": jobs}
        return Section("_overview.html", (), overview_values, path, cluster_version)
    if path == "/ui/queue":
        filters, page = _queue_query(view.query)

        async def queue_values() -> dict[str, Any]:
            shown = data.queue_page(ctrl, principal, filters["project"], filters["user"], filters["state"], page,
                                    app[QUEUE_KEY], app[LIVE].version())
            return {"q": shown, "filters": filters, "query": {k: v for k, v in filters.items() if v},
                    "states": sorted(ACTIVE)}
        return Section("_queue.html", (principal.user, principal.admin), queue_values, path, cluster_version)
    if path == "/ui/nodes":
        async def nodes_values() -> dict[str, Any]:
            return {"nodes": data.node_views(ctrl)}
        return Section("_nodes.html", (principal.admin, session.nonce), nodes_values, path, cluster_version)
    if path.startswith("/ui/jobs/") and path.count("/") == 3 and is_job_id(path[len("/ui/jobs/"):]):
        job_id = path[len("/ui/jobs/"):]

        async def job_values() -> dict[str, Any]:
            return await data.job_page(ctrl, principal, job_id)
        def job_version() -> object:
            # An ended job (or array) is in the store for good: what its page shows no longer changes.
            return cluster_version() if ctrl.cluster.job_service.select(job_id) else ENDED
        return Section("_job.html", (principal.user, principal.admin, session.nonce), job_values, path, job_version)
    return None


async def section_text(app: web.Application, session: Session, principal: Principal, view: URL) -> str | None:
    """The live part of the page at ``view`` as HTML, made once per cluster version for all who see the same.

    Every open dashboard of the same audience gets the same text (the same
    object, until the state it shows changed); while it is being made, the
    others wait for it rather than make it again. Kept
    FRAGMENT_S at most, for what changes without a durable write
    (utilisation samples). None when the page has no live part.
    """
    part = section(app, session, principal, view)
    if part is None:
        return None
    cache, now = app[FRAGMENT_KEY], time.monotonic()
    version = part.version()
    key = (str(view), part.template, part.who)
    hit = cache.get(key)
    if hit is not None and hit[0] == version and (version is ENDED or now - hit[1] < FRAGMENT_S):
        return await asyncio.shield(hit[2])
    made = asyncio.ensure_future(part_text(app, session, principal, part))
    if len(cache) >= FRAGMENTS_KEPT:
        cache.clear()
    cache[key] = (version, now, made)
    try:
        return await asyncio.shield(made)
    except BaseException:
        if cache.get(key, (None, None, None))[2] is made:
            del cache[key]  # a refusal (unknown job, bad filter) is not kept: the next asker gets it anew
        raise


async def part_text(app: web.Application, session: Session, principal: Principal, part: Section) -> str:
    """The live part ``part`` made now as HTML for this session (its forms carry the session's CSRF token)."""
    values = await part.values()
    return render_text(app, part.template, app[SIGNER].csrf(session.nonce), principal, part.path, **values)


async def _live(request: web.Request) -> web.Response:
    text = await section_text(request.app, request[SESSION], request[PRINCIPAL], request.rel_url)
    assert text is not None  # only the pages with a live part call this
    return web.Response(text=text, content_type="text/html", charset="utf-8")


async def overview(request: web.Request) -> web.Response:
    if request.headers.get("HX-Request"):
        return await _live(request)
    ctrl = request.app[CONTROLLER]
    pools = data.gpu_cells(ctrl)
    jobs = {"pending": 0, "running": 0}
    for job in ctrl.cluster.jobs.values():
        jobs["pending" if job.state == "PENDING" else "running"] += 1
    return render(request, "overview.html", title="Overview", pools=pools, counts=data.counts(pools), jobs=jobs)


async def queue(request: web.Request) -> web.Response:
    ctrl, principal = request.app[CONTROLLER], request[PRINCIPAL]
    filters, page = _queue_query(request.query)
    if request.headers.get("HX-Request"):
        return await _live(request)
    shown = data.queue_page(ctrl, principal, filters["project"], filters["user"], filters["state"], page,
                            request.app[QUEUE_KEY], request.app[LIVE].version())
    query = {k: v for k, v in filters.items() if v}
    return render(request, "queue.html", title="Queue", q=shown, filters=filters, query=query, states=sorted(ACTIVE))


async def job(request: web.Request) -> web.Response:
    ctrl, principal = request.app[CONTROLLER], request[PRINCIPAL]
    if request.headers.get("HX-Request"):
        return await _live(request)
    shown = await data.job_page(ctrl, principal, request.match_info["id"])
    return render(request, "job.html", title=f"Job {shown['job']['id']}", **shown)


async def change_job(request: web.Request) -> web.Response:
    """Cancel, hold or release a job (or an array) of the caller's own, then back to its page."""
    ctrl, principal = request.app[CONTROLLER], request[PRINCIPAL]
    job_id, verb = request.match_info["id"], request.match_info["verb"]
    if not is_job_id(job_id):
        raise api.ApiError(404, f"no job {job_id!r}: job ids look like 42 or 42_7")
    jobs = ctrl.cluster.job_service.select(job_id)
    if not jobs:
        raise api.ApiError(409, f"job {job_id} is not pending or running, so it cannot be changed")
    for one in jobs:
        api.owned(principal, one)
    for start in range(0, len(jobs), api.CHANGE_SLICE):
        ctrl.cluster.job_service.change_many(jobs[start:start + api.CHANGE_SLICE], verb, principal.user)
        await ctrl.commit()
    raise web.HTTPSeeOther(location=f"/ui/jobs/{job_id}")


async def nodes(request: web.Request) -> web.Response:
    if request.headers.get("HX-Request"):
        return await _live(request)
    return render(request, "nodes.html", title="Nodes", nodes=data.node_views(request.app[CONTROLLER]))


async def change_node(request: web.Request) -> web.Response:
    """Drain (with a reason) or resume a node: admins only."""
    ctrl, principal = request.app[CONTROLLER], request[PRINCIPAL]
    api.require_admin(principal)
    name, verb = request.match_info["name"], request.match_info["verb"]
    node = ctrl.cluster.nodes.get(name)
    if node is None:
        raise api.ApiError(404, f"no node {name!r}")
    if verb == "drain":
        form = await request.post()
        reason = form.get("reason")
        if not isinstance(reason, str) or not reason.strip():
            raise api.ApiError(422, "say why the node is drained")
        ctrl.cluster.node_messages.drain(node, reason.strip(), principal.user)
    else:
        ctrl.cluster.node_messages.resume(node, principal.user)
    await ctrl.commit()
    raise web.HTTPSeeOther(location="/ui/nodes")


async def projects(request: web.Request) -> web.Response:
    ctrl = request.app[CONTROLLER]
    now = time.time()
    cache = request.app[USAGE_KEY]
    if not cache or now - cache["at"] > USAGE_CACHE_S:  # reading a week of ended jobs is worth keeping a minute
        cache.update(at=now, series=await data.usage_series(ctrl, now))
    series = cache["series"]
    hours = [time.strftime("%H:00", time.gmtime(now - 86400 + h * 3600)) for h in range(24)]
    days = [time.strftime("%a %d", time.gmtime(now - 7 * 86400 + d * 86400)) for d in range(7)]
    drawn = {project: {"day": charts.bars(s["day"], hours), "week": charts.bars(s["week"], days),
                       "day_total": sum(s["day"]), "week_total": sum(s["week"])}
             for project, s in series.items()}
    return render(request, "projects.html", title="Projects", pools=data.queues(ctrl), usage=drawn,
                  chart={"width": charts.WIDTH, "height": charts.HEIGHT})


def _report_query(request: web.Request) -> tuple[str, str]:
    by, window = request.query.get("by", "project"), request.query.get("window", "week")
    if by not in GROUPINGS:
        raise api.ApiError(422, f"by is one of {', '.join(GROUPINGS)}, not {by!r}")
    if window not in WINDOWS:
        raise api.ApiError(422, f"window is one of {', '.join(WINDOWS)}, not {window!r}")
    return by, window


async def usage(request: web.Request) -> web.Response:
    by, window = _report_query(request)
    rows = await data.report(request.app[CONTROLLER], request[PRINCIPAL], by, WINDOWS[window])
    return render(request, "usage.html", title="Usage", rows=rows, by=by, window=window, groupings=GROUPINGS,
                  windows=list(WINDOWS))


async def usage_csv(request: web.Request) -> web.Response:
    by, window = _report_query(request)
    rows = await data.report(request.app[CONTROLLER], request[PRINCIPAL], by, WINDOWS[window])
    out = io.StringIO()
    fields = [by, "gpu_hours", "cpu_hours", "jobs", "mean_wait_s", "p95_wait_s", "gpu_utilization",
              "gpu_memory_peak_gib"]
    writer = csv.writer(out)
    writer.writerow(fields)
    for row in rows:
        writer.writerow([_cell(row.get(f)) for f in fields])
    return web.Response(text=out.getvalue(), content_type="text/csv", charset="utf-8",
                        headers={"Content-Disposition": f'attachment; filename="gpud-usage-{by}-{window}.csv"'})


def _cell(value: object) -> object:
    """A CSV cell: numbers as they are, text that a spreadsheet would run as a formula quoted with '."""
    if isinstance(value, float):
        return round(value, 6)
    if isinstance(value, str) and value[:1] in ("=", "+", "-", "@"):
        return "'" + value
    return "" if value is None else value


async def tokens(request: web.Request) -> web.Response:
    """The active tokens (by id, never the token): admins only."""
    api.require_admin(request[PRINCIPAL])
    from gpud.controller.auth import token_id
    shown = [{"id": token_id(t.hash), "user": t.user, "admin": t.admin, "created": t.created}
             for t in request.app[CONTROLLER].auth.active()]
    return render(request, "tokens.html", title="Tokens", tokens=shown)


USAGE_KEY: web.AppKey[dict] = web.AppKey("ui_usage_cache")
QUEUE_KEY: web.AppKey[dict] = web.AppKey("ui_queue_cache")
FRAGMENT_KEY: web.AppKey[dict] = web.AppKey("ui_fragments")


def add_routes(app: web.Application) -> None:
    """Register the pages and their forms."""
    app[USAGE_KEY] = {}
    app[QUEUE_KEY] = {}
    app[FRAGMENT_KEY] = {}
    app.router.add_get("/ui/", overview)
    app.router.add_get("/ui/queue", queue)
    app.router.add_get("/ui/jobs/{id}", job)
    app.router.add_post("/ui/jobs/{id}/{verb:cancel|hold|release}", change_job)
    app.router.add_get("/ui/nodes", nodes)
    app.router.add_post("/ui/nodes/{name}/{verb:drain|resume}", change_node)
    app.router.add_get("/ui/projects", projects)
    app.router.add_get("/ui/usage", usage)
    app.router.add_get("/ui/usage.csv", usage_csv)
    app.router.add_get("/ui/admin/tokens", tokens)
