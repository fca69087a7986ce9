"""The dashboard's pages: each handler reads its query, asks gpud/ui/data.py, and renders a template."""

from __future__ import annotations

import csv
import io
import time
from typing import Callable

from aiohttp import web

from gpud.accounting.report import GROUPINGS
from gpud.controller import api
from gpud.controller.keys import CONTROLLER, PRINCIPAL
from gpud.lifecycle import ACTIVE
from gpud.submission import is_job_id
from gpud.ui import charts, data
from gpud.ui.app import LIVE, render

WINDOWS = {"day": 86400.0, "week": 7 * 86400.0, "month": 30 * 86400.0}
USAGE_CACHE_S = 60.0
FRAGMENT_S = 10.0
FRAGMENTS_KEPT = 256


def live_fragment(request: web.Request, who: tuple, make: Callable[[], web.Response]) -> web.Response:
    """A page's live part (an htmx request), made once per cluster version for all who would see the same.

    ``who`` says what the fragment depends on besides the cluster and the
    query: nothing for public content, the user and whether an admin for
    content shown through the API's visibility rules. Kept FRAGMENT_S at
    most, for what changes without a durable write (utilisation samples).
    """
    if not request.headers.get("HX-Request"):
        return make()
    cache, version, now = request.app[FRAGMENT_KEY], request.app[LIVE].version(), time.monotonic()
    key = (request.path_qs, who)
    hit = cache.get(key)
    if hit is not None and hit[0] == version and now - hit[1] < FRAGMENT_S:
        return web.Response(text=hit[2], content_type="text/html", charset="utf-8")
    response = make()
    if len(cache) >= FRAGMENTS_KEPT:
        cache.clear()
    cache[key] = (version, now, response.text)
    return response


async def overview(request: web.Request) -> web.Response:
    ctrl = request.app[CONTROLLER]

    def make() -> web.Response:
        pools = data.gpu_cells(ctrl)
        jobs = {"pending": 0, "running": 0}
        for job in ctrl.cluster.jobs.values():
            jobs["pending" if job.state == "PENDING" else "running"] += 1
        return render(request, "overview.html" if not request.headers.get("HX-Request") else "_overview.html",
                      title="Overview", pools=pools, counts=data.counts(pools), jobs=jobs)
    return live_fragment(request, (), make)  # public fields only: the same for every user


def _choice(request: web.Request, key: str) -> str | None:
    value = request.query.get(key, "").strip()
    return value or None


async def queue(request: web.Request) -> web.Response:
    ctrl, principal = request.app[CONTROLLER], request[PRINCIPAL]
    state = _choice(request, "state")
    if state is not None and state.upper() not in ACTIVE:
        raise api.ApiError(422, f"state is one of {', '.join(sorted(ACTIVE))}, not {state!r}")
    try:
        page = int(request.query.get("page", "1"))
    except ValueError:
        raise api.ApiError(400, "page must be a number") from None
    filters = {"project": _choice(request, "project"), "user": _choice(request, "user"),
               "state": state.upper() if state else None}

    def make() -> web.Response:
        shown = data.queue_page(ctrl, principal, filters["project"], filters["user"], filters["state"], page,
                                request.app[QUEUE_KEY], request.app[LIVE].version())
        query = {k: v for k, v in filters.items() if v}
        return render(request, "_queue.html" if request.headers.get("HX-Request") else "queue.html", title="Queue",
                      q=shown, filters=filters, query=query, states=sorted(ACTIVE))
    return live_fragment(request, (principal.user, principal.admin), make)


async def job(request: web.Request) -> web.Response:
    ctrl, principal = request.app[CONTROLLER], request[PRINCIPAL]
    shown = await data.job_page(ctrl, principal, request.match_info["id"])
    name = "_job.html" if request.headers.get("HX-Request") else "job.html"
    return render(request, name, title=f"Job {shown['job']['id']}", **shown)


async def change_job(request: web.Request) -> web.Response:
    """Cancel, hold or release a job (or an array) of the caller's own, then back to its page."""
    ctrl, principal = request.app[CONTROLLER], request[PRINCIPAL]
    job_id, verb = request.match_info["id"], request.match_info["verb"]
    if not is_job_id(job_id):
        raise api.ApiError(404, f"no job {job_id!r}: job ids look like 42 or 42_7")
    jobs = ctrl.cluster.select(job_id)
    if not jobs:
        raise api.ApiError(409, f"job {job_id} is not pending or running, so it cannot be changed")
    for one in jobs:
        api.owned(principal, one)
    for start in range(0, len(jobs), api.CHANGE_SLICE):
        ctrl.cluster.change_many(jobs[start:start + api.CHANGE_SLICE], verb, principal.user)
        await ctrl.commit()
    raise web.HTTPSeeOther(location=f"/ui/jobs/{job_id}")


async def nodes(request: web.Request) -> web.Response:
    ctrl = request.app[CONTROLLER]
    name = "_nodes.html" if request.headers.get("HX-Request") else "nodes.html"
    return render(request, name, title="Nodes", nodes=data.node_views(ctrl))


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
        ctrl.cluster.drain(node, reason.strip(), principal.user)
    else:
        ctrl.cluster.resume(node, principal.user)
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
