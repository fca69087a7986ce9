"""Live updates as server-sent events: each open page's live part when the cluster changed, and a job's log.

The stream carries the page's fragment itself, made by the same view (and
the same visibility rules) as a reload or an htmx request. One watcher
pushes to every open stream: it looks at the controller's durable-write
counter (so an idle cluster costs nothing), and on a change (as often as
its CPU budget allows: gpud/ui/pacing.py) makes each open page's
part once for all who see the same (an audience) and writes the same bytes
to each of them; an audience whose part came out as before gets nothing,
and a part whose state cannot have changed (an ended job's) is not made
again. The streams themselves wait without a timer or a task wake-up of
their own.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Coroutine, Generator

from aiohttp import web
from yarl import URL

from gpud.controller import api
from gpud.controller.auth import Principal
from gpud.controller.keys import CONTROLLER, PRINCIPAL
from gpud.controller.service import Controller
from gpud.ui.pacing import PushBudget
from gpud.ui.session import Session

if TYPE_CHECKING:
    from gpud.ui.pages import Section

log = logging.getLogger("gpud.ui")

POLL_S = 1.0          # how often the watcher looks for a change
KEEPALIVE_S = 15.0    # a comment line on a stream quiet this long keeps proxies from closing it
FRAGMENT_S = 10.0     # a part is made again this often at most when only samples changed (no durable write)
ENDED = ("ended",)    # the version of what no longer changes: a job that is no longer pending or running
LOG_CHUNK = 64 * 1024


@dataclass(eq=False, slots=True)
class Stream:
    """One open page's event stream: who asked, for which page, and what it was last sent."""

    request: web.Request
    response: web.StreamResponse
    session: Session
    who: tuple[str, bool]               # the user and whether an admin, as when the stream opened
    audience: "Audience | None"         # None: the page has no live part, it is only nudged
    sent: bytes | None = None           # the last part written (the same object for its whole audience)
    behind: bool = False                # a push found its connection still busy: it gets the part later
    last_write: float = 0.0
    done: asyncio.Event = field(default_factory=asyncio.Event)


@dataclass(eq=False, slots=True)
class Audience:
    """The open streams that see the same live part (same page, same user where it matters), and that part."""

    key: tuple
    part: "Section"
    streams: list[Stream] = field(default_factory=list)
    version: object = None
    made: float = 0.0
    event: bytes | None = None          # the part as an ``event: section``, or None when it cannot be made


class Live:
    """The dashboard's open streams and the one watcher that pushes to them, as often as its
    ``PushBudget`` allows (gpud/ui/pacing.py)."""

    def __init__(self, ctrl: Controller) -> None:
        self.ctrl = ctrl
        self.closing = asyncio.Event()
        self.streams: list[Stream] = []
        self.audiences: dict[tuple, Audience] = {}
        self.changes = 0                 # how many pushes were made so far
        self.budget = PushBudget()

    @property
    def open(self) -> int:
        """How many streams are open."""
        return len(self.streams)

    def version(self) -> tuple[int, int]:
        """Changes when the cluster's state does: its durable writes and the jobs it holds."""
        ctrl = self.ctrl
        return ctrl.persist.batches, len(ctrl.cluster.jobs)

    def join(self, request: web.Request, response: web.StreamResponse, session: Session, principal: Principal,
             part: "Section | None", view: URL | None) -> Stream:
        """Add an open stream for the page ``view`` whose live part is ``part`` (None: nudges only)."""
        audience = None
        if part is not None and view is not None:
            key = (str(view), part.template, part.who)
            audience = self.audiences.get(key)
            if audience is None:
                audience = self.audiences[key] = Audience(key, part)
            audience.streams.append(stream := Stream(request, response, session, (principal.user, principal.admin),
                                                     audience))
        else:
            stream = Stream(request, response, session, (principal.user, principal.admin), None)
        stream.last_write = time.monotonic()
        self.streams.append(stream)
        return stream

    def leave(self, stream: Stream) -> None:
        """Forget a stream that ended."""
        stream.done.set()
        with contextlib.suppress(ValueError):
            self.streams.remove(stream)
        audience = stream.audience
        if audience is not None:
            with contextlib.suppress(ValueError):
                audience.streams.remove(stream)
            if not audience.streams and self.audiences.get(audience.key) is audience:
                del self.audiences[audience.key]

    async def watch(self, app: web.Application) -> None:
        """Push to the open streams on each change, as often as the budget allows, until closed."""
        seen, budget = self.version(), self.budget
        while await self.pause(POLL_S):
            budget.earn(time.process_time())
            if not self.streams:
                seen = self.version()
                continue
            now, version = time.monotonic(), self.version()
            if version != seen and budget.may_push(now):
                seen = version
                self.changes += 1
                push = OwnTime(self.push(app))
                try:
                    await push
                except Exception:  # one bad part must not stop every dashboard's updates
                    log.exception("the dashboard's live parts could not be pushed")
                budget.paid(now, push.cpu)
            else:
                tend = OwnTime(self.tend(now))
                await tend
                budget.charge(tend.cpu)
        for stream in list(self.streams):
            stream.done.set()

    async def push(self, app: web.Application) -> None:
        """Each audience's part made anew where its state changed, and written to whoever has not got it."""
        from gpud.ui.pages import part_text

        ctrl, now = self.ctrl, time.time()
        for stream in list(self.streams):
            principal = _principal(ctrl, stream.session)
            if principal is None or stream.session.expires <= now or \
                    (principal.user, principal.admin) != stream.who:
                # Signed out, revoked or changed: its fetch leads to the sign-in page, or a stream for who it is.
                await self._write(stream, CHANGE)
                self.leave(stream)
            elif stream.audience is None:
                await self._write(stream, CHANGE)
        for audience in list(self.audiences.values()):
            if not audience.streams:
                continue
            part, made = audience.part, time.monotonic()
            version = part.version()
            stale = version is not ENDED and made - audience.made >= FRAGMENT_S
            if audience.version != version or stale:
                first = audience.streams[0]
                principal = _principal(ctrl, first.session)
                if principal is None:  # revoked while this push went on: the next push ends its streams
                    continue
                text = None
                with contextlib.suppress(web.HTTPException, LookupError):
                    text = await part_text(app, first.session, principal, part)
                audience.version, audience.made = version, made
                event = _event("section", text) if text is not None else None
                if event is None or event != audience.event:  # the same bytes as before: nobody needs them
                    audience.event = event
            for stream in list(audience.streams):
                if audience.event is None:
                    await self._write(stream, CHANGE)
                elif stream.sent is not audience.event:
                    if await self._write(stream, audience.event):
                        stream.sent = audience.event

    async def tend(self, now: float) -> None:
        """Between pushes: end the streams whose browser left, catch up those that were busy, keep quiet ones open."""
        for stream in list(self.streams):
            if _gone(stream.request):
                self.leave(stream)
            elif stream.behind and stream.audience is not None and stream.audience.event is not None:
                if await self._write(stream, stream.audience.event):
                    stream.sent = stream.audience.event
            elif now - stream.last_write >= KEEPALIVE_S:
                await self._write(stream, KEEPALIVE)

    async def _write(self, stream: Stream, data: bytes) -> bool:
        """Write ``data`` to ``stream`` unless its connection is gone (it ends) or still busy (it is behind)."""
        transport = stream.request.transport
        if transport is None or transport.is_closing():
            self.leave(stream)
            return False
        if transport.get_write_buffer_size() > 0:  # a slow reader holds up neither the watcher nor the others
            stream.behind = True
            return False
        try:
            await stream.response.write(data)
        except (ConnectionError, RuntimeError):
            self.leave(stream)
            return False
        stream.behind, stream.last_write = False, time.monotonic()
        return True

    def close(self) -> None:
        """End every open stream (the server is stopping)."""
        self.closing.set()
        for stream in list(self.streams):
            stream.done.set()

    async def pause(self, seconds: float) -> bool:
        """Wait ``seconds``; False when the server is stopping."""
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(self.closing.wait(), seconds)
        return not self.closing.is_set()


class OwnTime:
    """Await a coroutine, counting the CPU time it takes itself (``cpu``, seconds), not that of the other
    tasks that run while it waits."""

    def __init__(self, coroutine: Coroutine[Any, Any, None]) -> None:
        self.coroutine, self.cpu = coroutine, 0.0

    def __await__(self) -> Generator[Any, Any, None]:
        value: Any = None
        error: BaseException | None = None
        while True:
            began = time.thread_time()
            try:
                waiting = self.coroutine.send(value) if error is None else self.coroutine.throw(error)
            except StopIteration:
                return
            finally:
                self.cpu += time.thread_time() - began
            try:
                value, error = (yield waiting), None
            except BaseException as exc:  # a cancellation goes on into the coroutine, as a plain await would
                value, error = None, exc


def _principal(ctrl: Controller, session: Session) -> Principal | None:
    from gpud.ui.app import principal_of
    return principal_of(ctrl, session)


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
    """The page's live part as ``event: section`` whenever the cluster changed (as often as the budget allows).

    The stream names its page (``?view=/ui/queue?state=PENDING``); the part
    is made once per change for everyone who sees the same, and each open
    dashboard costs one write, none when its part did not change (an ended
    job). A page without a live part, or one that cannot be made (a job
    that is gone), gets ``event: change`` instead and
    fetches what it shows itself; so does a session that ended or whose
    token was revoked (its fetch then leads to the sign-in page), and its
    stream ends.
    """
    from gpud.ui.app import LIVE, SESSION
    from gpud.ui.pages import section

    live: Live = request.app[LIVE]
    session, principal, view = request[SESSION], request[PRINCIPAL], _view(request)
    part = None
    if view is not None:
        with contextlib.suppress(web.HTTPException, LookupError):
            part = section(request.app, session, principal, view)
    response = await _stream(request)
    stream = live.join(request, response, session, principal, part, view)
    try:
        await response.write(b"retry: 3000\n\n")
        if not live.closing.is_set():
            await stream.done.wait()
    except ConnectionError:
        pass
    finally:
        live.leave(stream)
    return response


CHANGE = b"event: change\ndata: \n\n"
KEEPALIVE = b": still here\n\n"


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
