"""Live updates as server-sent events: each open page's live part when the cluster changed, and a job's log.

The stream carries the page's fragment itself, made by the same view (and
the same visibility rules) as a reload or an htmx request, once per change
for all who would see the same, so ten open dashboards cost ten writes a
change rather than ten requests. The controller's durable-write counter
tells that something changed without looking at a single job, so an idle
cluster costs nothing.
"""

from __future__ import annotations

import asyncio
import contextlib
import time

from aiohttp import web
from yarl import URL

from gpud.controller import api
from gpud.controller.keys import CONTROLLER, PRINCIPAL
from gpud.controller.service import Controller

POLL_S = 1.0          # how often a stream looks for a change
MIN_GAP_S = 2.0       # at most one nudge per stream this often, however busy the cluster
KEEPALIVE_S = 15.0    # a comment line this often keeps proxies from closing a quiet stream
LOG_CHUNK = 64 * 1024


class Live:
    """The dashboard's open streams and the one watcher that wakes them.

    One task looks at the cluster's version every POLL_S and wakes every
    open stream at once (a change, at most every MIN_GAP_S, or a keepalive),
    so a stream costs nothing between wake-ups: no timer of its own.
    """

    def __init__(self, ctrl: Controller) -> None:
        self.ctrl = ctrl
        self.closing = asyncio.Event()
        self.open = 0
        self.changes = 0                     # how many changes were announced so far
        self._wake = asyncio.Event()         # replaced by a fresh one at every wake-up
        self._encoded: dict[int, tuple[str, bytes]] = {}   # by the text's identity: it is kept alive here

    def section_event(self, text: str) -> bytes:
        """``text`` as an ``event: section``, encoded once for every stream that sends the same text."""
        hit = self._encoded.get(id(text))
        if hit is None or hit[0] is not text:
            if len(self._encoded) >= 64:
                self._encoded.clear()
            hit = self._encoded[id(text)] = (text, _event("section", text))
        return hit[1]

    def version(self) -> tuple[int, int]:
        """Changes when the cluster's state does: its durable writes and the jobs it holds."""
        ctrl = self.ctrl
        return ctrl.persist.batches, len(ctrl.cluster.jobs)

    async def watch(self) -> None:
        """Wake the open streams on each change (at most every MIN_GAP_S) and every KEEPALIVE_S; until closed."""
        seen, quiet = self.version(), 0.0
        while await self.pause(POLL_S):
            quiet += POLL_S
            now = self.version()
            if now != seen:
                seen, quiet = now, 0.0
                self.changes += 1
                self._wake_all()
                if not await self.pause(MIN_GAP_S - POLL_S):
                    break
            elif quiet >= KEEPALIVE_S:
                quiet = 0.0
                self._wake_all()
        self._wake_all()

    def _wake_all(self) -> None:
        wake, self._wake = self._wake, asyncio.Event()
        wake.set()

    async def next(self) -> int:
        """Wait for the next wake-up; returns how many changes were announced by then."""
        await self._wake.wait()
        return self.changes

    def close(self) -> None:
        """End every open stream (the server is stopping)."""
        self.closing.set()
        self._wake_all()

    async def pause(self, seconds: float) -> bool:
        """Wait ``seconds``; False when the server is stopping."""
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(self.closing.wait(), seconds)
        return not self.closing.is_set()


async def _stream(request: web.Request) -> web.StreamResponse:
    response = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-store",
                                           "X-Accel-Buffering": "no"})
    await response.prepare(request)
    return response


def _gone(request: web.Request) -> bool:
    return request.transport is None or request.transport.is_closing()


def _view(request: web.Request) -> URL | None:
    """The page a stream is for (its ``view``: a path and query under /ui/), or None to send only nudges."""
    given = request.query.get("view", "")
    if not given.startswith("/ui/") or given.startswith("//"):
        return None
    try:
        view = URL(given)
    except ValueError:
        return None
    return view if not view.is_absolute() else None


async def events(request: web.Request) -> web.StreamResponse:
    """The page's live part as ``event: section`` whenever the cluster changed (at most every MIN_GAP_S).

    The stream names its page (``?view=/ui/queue?state=PENDING``); the part
    is made once per change for everyone who sees the same, and each open
    dashboard costs one write, none when its part did not change (an ended
    job). A page without a live part, or one that cannot be made (a job
    that is gone), gets ``event: change`` instead and
    fetches what it shows itself; so does a session that ended or whose
    token was revoked (its fetch then leads to the sign-in page), and its
    stream ends.
    """
    from gpud.ui.app import LIVE, SESSION, principal_of
    from gpud.ui.pages import section_text

    live: Live = request.app[LIVE]
    ctrl, session, view = request.app[CONTROLLER], request[SESSION], _view(request)
    response = await _stream(request)
    seen, sent = live.changes, None
    live.open += 1
    try:
        await response.write(b"retry: 3000\n\n")
        while not live.closing.is_set() and not _gone(request):
            changes = await live.next()
            if live.closing.is_set() or _gone(request):
                break
            if changes == seen:
                await response.write(b": still here\n\n")
                continue
            seen = changes
            principal = principal_of(ctrl, session)
            if principal is None or session.expires <= time.time():
                await response.write(CHANGE)
                break
            text = None
            if view is not None:
                with contextlib.suppress(web.HTTPException, LookupError):
                    text = await section_text(request.app, session, principal, view)
            if text is None:
                await response.write(CHANGE)
            elif text != sent:  # the same text as last time: the page already shows it
                await response.write(live.section_event(text))
                sent = text
    except ConnectionError:
        pass
    finally:
        live.open -= 1
    return response


CHANGE = b"event: change\ndata: \n\n"


def _event(kind: str, text: str) -> bytes:
    lines = text.replace("\r\n", "\n").replace("\r", "\n").split("\n")
    return (f"event: {kind}\n" + "".join(f"data: {line}\n" for line in lines) + "\n").encode()


async def job_log(request: web.Request) -> web.StreamResponse:
    """Task 0's output as ``event: log`` chunks while the job runs, then ``event: end``; its owner's and admins'."""
    from gpud.ui.app import LIVE

    ctrl, principal, live = request.app[CONTROLLER], request[PRINCIPAL], request.app[LIVE]
    job = await api.find_job(ctrl, request.match_info["id"])
    api.owned(principal, job)
    response = await _stream(request)
    offset = 0
    try:
        await response.write(b"retry: 5000\n\n")
        while not _gone(request):
            current = ctrl.cluster.jobs.get(job.id) or job
            node = api.log_node(current, 0)
            if not node:
                if job.id not in ctrl.cluster.jobs or current.state != "PENDING":
                    await response.write(_event("end", "the job never ran, so it has no log"))
                    break
                if not await live.pause(POLL_S):
                    break
                continue
            try:
                chunk = await ctrl.read_log(node, current.id, 0, api.log_path(current, 0, "out"), offset,
                                            LOG_CHUNK, current.user)
            except (LookupError, asyncio.TimeoutError):
                chunk = {"error": f"node {node} is not connected"}
            if chunk.get("error"):
                await response.write(_event("end", f"(no log: {chunk['error']})"))
                break
            data = chunk.get("data", "")
            if data:
                await response.write(_event("log", data))
                offset = int(chunk.get("offset", offset + len(data.encode())))
                continue
            if current.state not in ("RUNNING", "PENDING") or job.id not in ctrl.cluster.jobs:
                await response.write(_event("end", ""))
                break
            if not await live.pause(POLL_S):
                break
    except ConnectionError:
        pass
    return response


def add_routes(app: web.Application) -> None:
    """Register the event streams."""
    app.router.add_get("/ui/events", events)
    app.router.add_get("/ui/jobs/{id}/log", job_log)
