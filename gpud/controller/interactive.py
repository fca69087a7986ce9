"""Terminals and port forwards of running jobs, relayed between gpuctl's WebSockets and the nodes' links.

gpuctl connects to the controller only (authenticated like every API call);
the controller relays to the job's node over the node's own connection, so
nothing new listens on a node. Only the job's owner and admins may attach,
run a command inside a job, or forward a port. A terminal outlives its
client for ``detach_timeout_s`` and keeps its output meanwhile, for
``gpuctl attach``. Interactive jobs whose GPUs stay idle and whose
terminals get no input for their priority class's ``idle_timeout`` are
warned on their terminal, then ended with the reason recorded.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import itertools
import json
import logging
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, AsyncIterator

from aiohttp import WSMsgType, web

from gpud import jsontext
from gpud.controller.api import ApiError, find_job
from gpud.controller.keys import CONTROLLER, PRINCIPAL
from gpud.jobs import Job
from gpud.lifecycle import CANCELLED, RUNNING

if TYPE_CHECKING:
    from gpud.controller.auth import Principal
    from gpud.controller.service import Controller

log = logging.getLogger("gpud.controller")
KEPT_OUTPUT = 1 << 20          # bytes of a terminal's latest output kept for a client that reattaches
OPEN_TIMEOUT_S = 20.0          # how long opening a terminal or a forward waits for the node
WATCH_PERIOD_S = 0.5
MAX_CLIENT_BACKLOG = 4096      # messages queued for one slow client before it is dropped
MAX_TERMINALS_PER_JOB = 32
JOB_SCAN_S = 1.0               # how often interactive jobs are looked at for detach and idle timeouts
_ids = itertools.count(1)


@dataclass(slots=True)
class Terminal:
    """One terminal on a node, as the controller relays it."""

    id: str
    job: str
    task: int
    node: str
    main: bool
    opened: asyncio.Future
    clients: list[asyncio.Queue] = field(default_factory=list)
    output: bytearray = field(default_factory=bytearray)
    dropped: int = 0                       # output bytes no longer kept
    detached_at: int = 0                   # output offset when the last client left
    detached_since: float | None = None
    exit: dict | None = None

    @property
    def end(self) -> int:
        """The offset just past the latest output."""
        return self.dropped + len(self.output)

    def since(self, offset: int) -> bytes:
        """The output kept from ``offset`` on."""
        return bytes(self.output[max(0, offset - self.dropped):])

    def append(self, data: bytes) -> None:
        """Keep ``data`` (dropping the oldest output beyond KEPT_OUTPUT) and pass it to every client."""
        self.output += data
        extra = len(self.output) - KEPT_OUTPUT
        if extra > 0:
            del self.output[:extra]
            self.dropped += extra
        self.tell(data)

    def tell(self, item: bytes | dict | None) -> None:
        """Queue output (bytes), a control message (dict) or the end (None) for every attached client."""
        for queue in list(self.clients):
            if queue.qsize() > MAX_CLIENT_BACKLOG:
                self.clients.remove(queue)
                queue.put_nowait(None)
            else:
                queue.put_nowait(item)


@dataclass(slots=True)
class Usage:
    """An interactive task's GPU activity as its node last reported it."""

    idle_s: float
    memory_gib: float
    received: float


@dataclass(slots=True)
class Hub:
    """Every terminal and forward the controller relays, and the interactive jobs' activity."""

    ctrl: Controller
    terminals: dict[str, Terminal] = field(default_factory=dict)
    forwards: dict[str, asyncio.Queue] = field(default_factory=dict)
    opening: dict[str, asyncio.Future] = field(default_factory=dict)
    last_input: dict[str, float] = field(default_factory=dict)
    usage: dict[str, Usage] = field(default_factory=dict)
    warned: dict[str, float] = field(default_factory=dict)     # job -> when it was warned of idle release
    unattended: dict[str, float] = field(default_factory=dict)  # job -> since when no client is attached
    scanned: float = 0.0

    # -- from the nodes ------------------------------------------------------

    def from_node(self, node: str, message: dict) -> None:
        """Take one ``pty_*``, ``fwd_*`` or ``interactive_usage`` message from node ``node``."""
        kind = message.get("type")
        if kind == "interactive_usage":
            now = time.time()
            for entry in message.get("tasks") or []:
                if isinstance(entry, dict) and isinstance(entry.get("idle_s"), (int, float)):
                    self.usage[str(entry.get("job"))] = Usage(float(entry["idle_s"]),
                                                              float(entry.get("memory_gib") or 0.0), now)
            return
        if kind in ("fwd_opened", "fwd_closed", "fwd_data"):
            conn = str(message.get("conn"))
            waiting = self.opening.get(conn)
            if waiting is not None and not waiting.done() and kind != "fwd_data":
                waiting.set_result(message)
                return
            queue = self.forwards.get(conn)
            if queue is not None:
                queue.put_nowait(_data(message) if kind == "fwd_data" else None)
            return
        terminal = self.terminals.get(str(message.get("session")))
        if terminal is None or terminal.node != node:
            return
        if kind == "pty_started":
            if not terminal.opened.done():
                terminal.opened.set_result(message)
        elif kind == "pty_out":
            terminal.append(_data(message))
        elif kind == "pty_exit":
            if not terminal.opened.done():
                terminal.opened.set_result(message)
                self.terminals.pop(terminal.id, None)
                return
            if terminal.exit is not None:
                return  # already told: its job was ended
            job = self.ctrl.cluster.jobs.get(terminal.job)
            if message.get("error"):  # the node lost it (its daemon restarted): the next attach opens another
                self.terminals.pop(terminal.id, None)
                terminal.exit = {"type": "error", "error": f"the terminal was lost on node {node} (its daemon "
                                                           f"restarted); gpuctl attach {terminal.job} opens a new one"
                                 if terminal.main else f"the terminal was lost on node {node}"}
            elif job is None or job.state != RUNNING:  # hung up because its job ended: say that, not SIGHUP
                terminal.exit = {"type": "ended", "reason": _ended_reason(job)}
            else:
                terminal.exit = {"type": "exit", "code": message.get("code"), "signal": message.get("signal")}
            terminal.tell(terminal.exit)
            terminal.tell(None)
            if not terminal.clients:
                terminal.detached_since = terminal.detached_since or time.time()

    # -- terminals -----------------------------------------------------------

    async def to_node(self, node: str, message: dict) -> None:
        """Send one message on a node's link; LookupError when the node is not connected."""
        link = self.ctrl.links.get(node)
        if link is None:
            raise LookupError(f"node {node} is not connected")
        try:
            await link.send_str(jsontext.dumps(message))
        except (ConnectionError, RuntimeError) as exc:
            raise LookupError(f"node {node} is not reachable: {exc}") from None

    def main_terminal(self, job: Job) -> Terminal | None:
        """The job's main terminal, when one is open (or kept for a client to come back)."""
        return next((t for t in self.terminals.values() if t.job == job.id and t.main), None)

    async def open(self, job: Job, task: int, argv: list[str] | None, *, main: bool, rows: int | None,
                   cols: int | None, term: str | None) -> Terminal:
        """Open a terminal in the job's task on its node; ApiError when the node cannot."""
        placement = job.runs[task].placement
        if placement is None:
            raise ApiError(409, f"job {job.id} task {task} holds no node now")
        if sum(1 for t in self.terminals.values() if t.job == job.id) >= MAX_TERMINALS_PER_JOB:
            raise ApiError(429, f"job {job.id} has {MAX_TERMINALS_PER_JOB} terminals open; close one first")
        ident = f"t{next(_ids)}-{time.monotonic_ns() % 10**9}"
        terminal = Terminal(ident, job.id, task, placement.node, main, asyncio.get_running_loop().create_future())
        self.terminals[ident] = terminal
        await self._start(terminal, job, argv, {"rows": rows, "cols": cols, "term": term})
        self.last_input.setdefault(job.id, time.time())
        return terminal

    async def reopen(self, terminal: Terminal, job: Job, size: dict) -> Terminal:
        """Ask the node again for a main terminal nobody is attached to, at the new client's size.

        The node answers at once for a terminal it has; one it lost (its
        daemon restarted) it starts again, running the job's command anew.
        """
        terminal.opened = asyncio.get_running_loop().create_future()
        await self._start(terminal, job, job.command, size)
        return terminal

    async def _start(self, terminal: Terminal, job: Job, argv: list[str] | None, size: dict) -> None:
        """Send ``pty_open`` for the terminal and wait for the node's answer; ApiError when it did not start."""
        node = terminal.node
        try:
            await self.to_node(node, {"type": "pty_open", "session": terminal.id, "job": job.id,
                                      "task": terminal.task, "attempt": job.runs[terminal.task].attempt,
                                      "argv": argv, "main": terminal.main, **size})
            answer = await asyncio.wait_for(asyncio.shield(terminal.opened), OPEN_TIMEOUT_S)
        except LookupError as exc:
            self.terminals.pop(terminal.id, None)
            raise ApiError(503, str(exc)) from None
        except asyncio.TimeoutError:
            self.terminals.pop(terminal.id, None)
            raise ApiError(504, f"node {node} did not open the terminal in time") from None
        if answer.get("type") != "pty_started":
            self.terminals.pop(terminal.id, None)
            raise ApiError(409, f"node {node}: {answer.get('error') or 'the terminal did not start'}")

    async def serve(self, request: web.Request, opening: Any) -> web.WebSocketResponse:
        """Open the terminal (``await opening()``) and relay one client's WebSocket to and from it until either ends.

        A terminal that cannot be opened is told to the client as ``{"type": "error"}``.
        """
        ws = web.WebSocketResponse(heartbeat=20.0, max_msg_size=1 << 20)
        await ws.prepare(request)
        try:
            terminal = await opening()
        except ApiError as exc:
            await ws.send_str(json.dumps({"type": "error", "error": _message(exc)}))
            await ws.close()
            return ws
        except asyncio.TimeoutError:
            await ws.send_str(json.dumps({"type": "error", "error": "the node did not open the terminal in time"}))
            await ws.close()
            return ws
        queue: asyncio.Queue = asyncio.Queue()
        backlog = terminal.since(terminal.detached_at if not terminal.clients else terminal.end)
        if backlog:
            queue.put_nowait(backlog)
        if terminal.exit is not None:
            queue.put_nowait(terminal.exit)
            queue.put_nowait(None)
        terminal.clients.append(queue)
        terminal.detached_since = None
        writer = asyncio.create_task(_write(ws, queue))
        try:
            async for frame in ws:
                message: dict | None = None
                if frame.type == WSMsgType.BINARY and terminal.exit is None:
                    self.last_input[terminal.job] = time.time()
                    self.warned.pop(terminal.job, None)
                    message = {"type": "pty_in", "session": terminal.id, "data": base64.b64encode(frame.data).decode()}
                elif frame.type == WSMsgType.TEXT and terminal.exit is None:
                    control = _control(frame.data)
                    if control.get("type") == "resize":
                        message = {"type": "pty_resize", "session": terminal.id, "rows": control.get("rows"),
                                   "cols": control.get("cols")}
                if message is not None:
                    try:
                        await self.to_node(terminal.node, message)
                    except LookupError as exc:  # the node may come back: the terminal stays
                        queue.put_nowait(f"\r\n[gpud] {exc}: what was typed is lost\r\n".encode())
        finally:
            writer.cancel()
            await asyncio.gather(writer, return_exceptions=True)
            if queue in terminal.clients:
                terminal.clients.remove(queue)
            if not terminal.clients:
                terminal.detached_since, terminal.detached_at = time.time(), terminal.end
                if terminal.exit is not None and queue.empty():
                    self.terminals.pop(terminal.id, None)  # its end was delivered
                elif not terminal.main:  # nothing reattaches to a `run --in` terminal: as srun's, it ends
                    self.terminals.pop(terminal.id, None)
                    with contextlib.suppress(LookupError):
                        await self.to_node(terminal.node, {"type": "pty_close", "session": terminal.id})
            await ws.close()
        return ws

    # -- forwards ----------------------------------------------------------

    async def forward(self, request: web.Request, job: Job, task: int, port: int) -> web.WebSocketResponse:
        """Relay one client's WebSocket to a TCP connection to ``port`` on the job's node."""
        ws = web.WebSocketResponse(heartbeat=20.0, max_msg_size=1 << 20)
        await ws.prepare(request)
        try:
            node, conn, queue = await self._open_forward(job, task, port)
        except ApiError as exc:
            await ws.send_str(json.dumps({"type": "error", "error": _message(exc)}))
            await ws.close()
            return ws
        await ws.send_str(json.dumps({"type": "opened", "node": node, "port": port}))
        writer = asyncio.create_task(_write(ws, queue))
        try:
            async for frame in ws:
                if frame.type == WSMsgType.BINARY:
                    await self.to_node(node, {"type": "fwd_data", "conn": conn,
                                              "data": base64.b64encode(frame.data).decode()})
        except LookupError:
            pass
        finally:
            writer.cancel()
            await asyncio.gather(writer, return_exceptions=True)
            if self.forwards.pop(conn, None) is not None:
                with contextlib.suppress(LookupError):
                    await self.to_node(node, {"type": "fwd_close", "conn": conn})
            await ws.close()
        return ws

    async def _open_forward(self, job: Job, task: int, port: int) -> tuple[str, str, asyncio.Queue]:
        """Ask the job's node to connect to ``port``: its name, the connection's id and its incoming queue."""
        placement = job.runs[task].placement
        if placement is None:
            raise ApiError(409, f"job {job.id} task {task} holds no node now")
        conn = f"f{next(_ids)}-{time.monotonic_ns() % 10**9}"
        waiting = asyncio.get_running_loop().create_future()
        self.opening[conn] = waiting
        queue: asyncio.Queue = asyncio.Queue()
        self.forwards[conn] = queue
        try:
            await self.to_node(placement.node, {"type": "fwd_open", "conn": conn, "job": job.id, "task": task,
                                                "attempt": job.runs[task].attempt, "port": port})
            answer = await asyncio.wait_for(waiting, OPEN_TIMEOUT_S)
        except LookupError as exc:
            self.forwards.pop(conn, None)
            raise ApiError(503, str(exc)) from None
        except asyncio.TimeoutError:
            self.forwards.pop(conn, None)
            raise ApiError(504, f"node {placement.node} did not open the connection in time") from None
        finally:
            self.opening.pop(conn, None)
        if answer.get("type") != "fwd_opened":
            self.forwards.pop(conn, None)
            raise ApiError(409, f"node {placement.node}: {answer.get('error') or 'the connection was refused'}")
        return placement.node, conn, queue

    # -- the watch -----------------------------------------------------------

    async def watch(self) -> None:
        """Hang up terminals left detached too long, and release idle interactive jobs, until cancelled."""
        while True:
            await asyncio.sleep(WATCH_PERIOD_S)
            try:
                if await self.check(time.time()):
                    await self.ctrl.commit()
            except Exception:  # noqa: BLE001 - the watch must go on
                log.exception("checking the terminals failed")

    async def check(self, now: float) -> bool:
        """One look at every terminal and, every JOB_SCAN_S, every interactive job; True when a job was ended."""
        jobs, ended = self.ctrl.cluster.jobs, False
        timeout = self.ctrl.config.detach_timeout_s
        for terminal in list(self.terminals.values()):
            job = jobs.get(terminal.job)
            if (job is None or job.state != RUNNING) and terminal.exit is None:
                terminal.exit = {"type": "ended", "reason": _ended_reason(job)}
                terminal.tell(terminal.exit)
                terminal.tell(None)
            if terminal.exit is not None and not terminal.clients and \
                    now - (terminal.detached_since or now) >= timeout:
                self.terminals.pop(terminal.id, None)  # kept so long for a client to learn how it ended
        if now - self.scanned < JOB_SCAN_S:
            return False
        self.scanned = now
        for job_id in [j for j in self.unattended if j not in jobs]:
            self.forget(job_id)
        attended = {t.job for t in self.terminals.values() if t.clients}
        for job in [j for j in jobs.values() if j.interactive and j.state == RUNNING]:
            if job.id in attended:
                self.unattended.pop(job.id, None)
            elif now - self.unattended.setdefault(job.id, now) >= timeout:
                self.end(job, f"nobody attached to its terminal for {_span(timeout)}", "its terminal was left alone")
                ended = True
                continue
            if self._idle(job, now):
                ended = True
        return ended

    def forget(self, job_id: str) -> None:
        """Drop what is known of a job that has ended."""
        for known in (self.unattended, self.last_input, self.usage, self.warned):
            known.pop(job_id, None)

    def end(self, job: Job, reason: str, stop_reason: str) -> None:
        """End the job CANCELLED with ``reason``, telling its terminals' clients why first."""
        for terminal in self.terminals.values():
            if terminal.job == job.id and terminal.exit is None:
                terminal.append(f"\r\n[gpud] job {job.id} ended: {reason}\r\n".encode())
                terminal.exit = {"type": "ended", "reason": reason}
                terminal.tell(terminal.exit)
                terminal.tell(None)
        self.ctrl.cluster.job_service.end(job, CANCELLED, reason, stop_reason=stop_reason)
        log.info("job %s ended: %s", job.id, reason)
        self.forget(job.id)

    def _idle(self, job: Job, now: float) -> bool:
        """Warn or end an idle interactive job as its class's idle_timeout says; True when it was ended.

        The warning always comes first, and the job ends no sooner than the
        warning said (a minute, or a quarter of the timeout when shorter).
        """
        limit = self.ctrl.policy.idle_timeouts.get(job.priority_class)
        usage = self.usage.get(job.id)
        if limit is None or usage is None:
            return False
        quiet = now - max(self.last_input.get(job.id, 0.0), job.started or now)
        idle = min(quiet, usage.idle_s + (now - usage.received))
        notice = min(60.0, limit / 4)
        warned = self.warned.get(job.id)
        if idle < limit - notice:
            self.warned.pop(job.id, None)
            return False
        if warned is None:
            self.warned[job.id] = now
            left = max(notice, limit - idle)
            text = (f"\r\n[gpud] job {job.id}: its GPUs have been idle and its terminal without input for "
                    f"{_span(idle)}; it ends in {_span(left)} (idle_timeout of priority class "
                    f"{job.priority_class}). Type anything or use the GPUs to keep it.\r\n")
            for terminal in self.terminals.values():
                if terminal.job == job.id and terminal.exit is None:
                    terminal.append(text.encode())
            return False
        if idle < limit or now - warned < notice:
            return False
        held = f" ({usage.memory_gib:g} GiB of memory held)" if usage.memory_gib > 0 else ""
        self.end(job, f"idle: its GPUs were idle{held} and its terminal had no input for {_span(limit)}, "
                      f"the idle_timeout of priority class {job.priority_class}", "idle")
        return True


def hub_of(ctrl: Controller) -> Hub:
    """The controller's hub, made on first use."""
    hub = getattr(ctrl, "interactive_hub", None)
    if hub is None:
        hub = Hub(ctrl)
        ctrl.interactive_hub = hub  # type: ignore[attr-defined]
    return hub


def may_enter(principal: Principal, job: Job) -> None:
    """403 unless the caller owns the job or is an admin: only they may attach, run inside or forward."""
    if not principal.admin and job.user != principal.user:
        raise ApiError(403, f"job {job.id} belongs to {job.user}; only its owner and admins may attach to it, "
                            f"run commands in it or forward its ports")


async def _running_job(request: web.Request) -> Job:
    ctrl, principal = request.app[CONTROLLER], request[PRINCIPAL]
    job = await find_job(ctrl, request.match_info["id"])
    may_enter(principal, job)
    if job.state != RUNNING:
        raise ApiError(409, f"job {job.id} is {job.state}" + (f": {job.reason}" if job.reason else "")
                       + ("; it has not started yet" if job.state == "PENDING" else ""))
    return job


def _query_int(request: web.Request, name: str, default: int | None, lo: int, hi: int) -> int | None:
    text = request.query.get(name)
    if text is None:
        return default
    if not text.isdigit() or not lo <= int(text) <= hi:
        raise ApiError(422, f"{name} must be an integer from {lo} to {hi}, not {text!r}")
    return int(text)


def _size(request: web.Request) -> dict:
    term = request.query.get("term")
    if term is not None and (len(term) > 64 or not term.replace("-", "").replace(".", "").isalnum()):
        raise ApiError(422, "term must be a terminal name such as xterm-256color")
    # 0 is a terminal that does not know its size (`script`, a bare pty): the node gives it 24x80.
    return {"rows": _query_int(request, "rows", 0, 0, 9999) or None,
            "cols": _query_int(request, "cols", 0, 0, 9999) or None, "term": term}


async def attach(request: web.Request) -> web.StreamResponse:
    """GET /api/v1/jobs/{id}/attach (WebSocket): the interactive job's main terminal, opened on first use."""
    job = await _running_job(request)
    if not job.interactive:
        raise ApiError(409, f"job {job.id} is a batch job with no terminal; `gpuctl run --in {job.id} -- CMD` "
                            f"runs a command inside it")
    size = _size(request)
    if not _upgrade(request):
        return _checked(job)
    hub = hub_of(request.app[CONTROLLER])

    async def opening() -> Terminal:
        terminal = hub.main_terminal(job)
        if terminal is None:
            return await hub.open(job, 0, job.command, main=True, **size)
        await asyncio.wait_for(asyncio.shield(terminal.opened), OPEN_TIMEOUT_S)
        if terminal.exit is None and not terminal.clients:
            return await hub.reopen(terminal, job, size)
        return terminal
    return await hub.serve(request, opening)


async def run_inside(request: web.Request) -> web.StreamResponse:
    """GET /api/v1/jobs/{id}/exec?argv=..&argv=.. (WebSocket): a new terminal running argv (or the login shell)."""
    job = await _running_job(request)
    task = _query_int(request, "task", 0, 0, job.tasks - 1)
    argv = request.query.getall("argv", [])
    if any("\0" in a for a in argv) or (argv and not argv[0]):
        raise ApiError(422, "argv must be non-empty strings without NUL bytes")
    size = _size(request)
    if not _upgrade(request):
        return _checked(job)
    hub = hub_of(request.app[CONTROLLER])
    return await hub.serve(request, lambda: hub.open(job, task or 0, argv or None, main=False, **size))


async def forward(request: web.Request) -> web.StreamResponse:
    """GET /api/v1/jobs/{id}/forward?port=P (WebSocket): a TCP connection to port P on the job's node.

    Without a WebSocket upgrade (as for attach and exec) it only checks that
    the caller may go ahead, and says where the job runs.
    """
    job = await _running_job(request)
    port = _query_int(request, "port", None, 1, 65535)
    task = _query_int(request, "task", 0, 0, job.tasks - 1) or 0
    if port is None:
        raise ApiError(422, "say which port: ?port=8888")
    if not _upgrade(request):
        return _checked(job, port=port)
    return await hub_of(request.app[CONTROLLER]).forward(request, job, task, port)


def _upgrade(request: web.Request) -> bool:
    return request.headers.get("Upgrade", "").lower() == "websocket"


def _checked(job: Job, **extra: Any) -> web.Response:
    """The answer to a check without a WebSocket: the caller may go ahead, and where it would go."""
    return web.json_response({"job": job.id, "nodes": job.nodes(), "interactive": job.interactive, **extra})


def _message(exc: ApiError) -> str:
    try:
        return str(json.loads(exc.text or "{}").get("error"))
    except ValueError:
        return exc.reason


def add_routes(app: web.Application) -> None:
    """Register the terminal and forward endpoints, and the watch that runs with the controller."""
    app.router.add_get("/api/v1/jobs/{id}/attach", attach)
    app.router.add_get("/api/v1/jobs/{id}/exec", run_inside)
    app.router.add_get("/api/v1/jobs/{id}/forward", forward)
    app.cleanup_ctx.append(_watching)


async def _watching(app: web.Application) -> AsyncIterator[None]:
    task = asyncio.create_task(hub_of(app[CONTROLLER]).watch(), name="gpud-interactive-watch")
    yield
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)


async def _write(ws: web.WebSocketResponse, queue: asyncio.Queue) -> None:
    while True:
        item = await queue.get()
        if item is None:
            await ws.close()
            return
        if isinstance(item, dict):
            await ws.send_str(json.dumps(item))
        else:
            await ws.send_bytes(item)


def _data(message: dict) -> bytes:
    try:
        return base64.b64decode(str(message.get("data") or ""), validate=True)
    except ValueError:
        return b""


def _control(text: str) -> dict:
    try:
        value = json.loads(text)
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


def _ended_reason(job: Job | None) -> str:
    if job is None:
        return "the job has ended"
    if job.state == "PENDING":
        return f"the job was stopped and waits again ({job.reason or 'requeued'}); gpuctl attach {job.id} once it runs"
    return f"the job is {job.state}"


def _span(seconds: float) -> str:
    seconds = max(0.0, seconds)
    if seconds < 120:
        return f"{seconds:.0f}s"
    if seconds < 7200:
        return f"{seconds / 60:.0f}m"
    return f"{seconds / 3600:.1f}h"
