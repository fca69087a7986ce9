"""Terminals and port forwards inside running tasks, carried over the node's one connection to the controller.

Nothing here listens on the network: the controller sends ``pty_*`` and
``fwd_*`` orders on the node's link (docs/api.md), and output, exits and
forwarded bytes go back the same way. A process started on a terminal runs
as the task's user, in its cgroups, directory and environment (read from
the task's own process, and the cgroups its supervisor recorded), so it
sees exactly the task's GPUs and is held to the task's limits.

An interactive job's task is a holder that waits until the job's main
terminal session ends, then exits with that session's exit status, so the
job ends COMPLETED or FAILED as the shell or command did.
"""

from __future__ import annotations

import asyncio
import base64
import errno
import fcntl
import logging
import os
import pwd
import signal
import struct
import sys
import termios
import time
from dataclasses import dataclass, field, replace
from typing import Any, Awaitable, Callable

from gpud.node import cgroups
from gpud.node.spec import TaskKey, TaskSpec
from gpud.node.taskstate import RUNNING, TaskState

log = logging.getLogger(__name__)
READ_CHUNK = 64 * 1024
SEND_BATCH = 256 * 1024     # most output bytes in one pty_out message
START_WAIT_S = 10.0         # how long an order waits for the task's process to be recorded
HANGUP_GRACE_S = 2.0        # after SIGHUP, the session's process group gets SIGKILL
DEFAULT_ROWS, DEFAULT_COLS = 24, 80  # a terminal whose client gave no size (a pipe, a 0x0 pty)
USAGE_PERIOD_S = 2.0        # how often interactive tasks' GPU activity is sampled and reported
BUSY_UTILIZATION = 1.0      # percent: below this a GPU counts as idle
CGROUP_CONTROLLERS = ("memory", "cpu", "cpuacct", "cpuset", "devices", "pids", "freezer")
_SOURCE_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# The holder an interactive task runs: it waits for the exit file the main session's end writes. A shell,
# not Python: the job's user may not be allowed to run the daemon's interpreter.
HOLD_SCRIPT = 'while [ ! -e "$1" ]; do sleep 0.2; done; read code < "$1"; exit "${code:-1}"'

Send = Callable[[dict], Awaitable[bool]]


def b64(data: bytes) -> str:
    """Bytes as the base64 text the node protocol carries them in."""
    return base64.b64encode(data).decode("ascii")


def unb64(text: Any) -> bytes:
    """The bytes of a base64 field; ValueError when it is not base64 text."""
    if not isinstance(text, str):
        raise ValueError("data must be base64 text")
    return base64.b64decode(text.encode("ascii"), validate=True)


@dataclass(slots=True)
class TaskContext:
    """What a process started inside a task inherits from the task's own process."""

    uid: int
    gid: int
    user: str
    home: str
    shell: str
    cwd: str
    env: dict[str, str]
    cgroup_procs: list[str]


def task_context(pid: int, task_dir: str | None = None) -> TaskContext:
    """The user, directory, environment and cgroups of process ``pid``, the task in ``task_dir``; OSError when
    it is gone. The cgroups are all the task's own (see :func:`task_cgroup_procs`)."""
    info = os.stat(f"/proc/{pid}")
    with open(f"/proc/{pid}/environ", "rb") as f:
        raw = f.read()
    env = {}
    for item in raw.split(b"\0"):
        key, sep, value = item.partition(b"=")
        if sep and key:
            env[key.decode("utf-8", "surrogateescape")] = value.decode("utf-8", "surrogateescape")
    cwd = os.readlink(f"/proc/{pid}/cwd")
    try:
        entry = pwd.getpwuid(info.st_uid)
        user, home, shell = entry.pw_name, entry.pw_dir, entry.pw_shell or "/bin/sh"
    except KeyError:
        user, home, shell = env.get("USER", str(info.st_uid)), env.get("HOME", "/"), "/bin/sh"
    return TaskContext(info.st_uid, info.st_gid, user, home, shell, cwd, env, task_cgroup_procs(pid, task_dir))


def task_cgroup_procs(pid: int, task_dir: str | None) -> list[str]:
    """The ``cgroup.procs`` files a process joins to be confined as the task in ``task_dir`` (process ``pid``).

    The groups its supervisor recorded come first, read from the task's
    directory rather than from where ``pid`` is now (a process of the task
    may have been moved elsewhere by root). In every other hierarchy (a
    time-sliced task's freezer group, say) it gets the groups ``pid`` is in
    that this daemon is not in itself.
    """
    group = cgroups.recorded(task_dir) if task_dir else None
    recorded = [path for path in (os.path.join(d, "cgroup.procs") for d in (group.paths() if group else []))
                if os.path.exists(path)]
    covered = {_hierarchy(path) for path in recorded}
    return [*recorded, *(path for path in _cgroup_procs(pid) if _hierarchy(path) not in covered)]


def _hierarchy(procs: str) -> int | None:
    """Which hierarchy a ``cgroup.procs`` file is in: each one is a file system of its own, whatever its mount's
    name (``cpu`` may be a link to ``cpu,cpuacct``)."""
    try:
        return os.stat(procs).st_dev
    except OSError:
        return None


def _cgroup_procs(pid: int) -> list[str]:
    """The ``cgroup.procs`` files of the cgroups ``pid`` is in that this daemon is not in itself."""
    mine, theirs = _cgroups("self"), _cgroups(str(pid))
    mounts = _cgroup_mounts()
    paths = []
    for hierarchy, path in theirs.items():
        if mine.get(hierarchy) == path or path == "/":
            continue
        found = mounts.get(hierarchy)
        if found is None:
            continue
        mount, root = found
        relative = path[len(root):] if root != "/" and path.startswith(root) else path
        procs = os.path.join(mount, relative.lstrip("/"), "cgroup.procs")
        if os.path.exists(procs):
            paths.append(procs)
    return paths


def _cgroups(pid: str) -> dict[str, str]:
    found = {}
    try:
        with open(f"/proc/{pid}/cgroup") as f:
            for line in f:
                _, controllers, path = line.rstrip("\n").split(":", 2)
                if not controllers:
                    found[""] = path
                for name in controllers.split(","):
                    if name in CGROUP_CONTROLLERS:
                        found[name] = path
    except (OSError, ValueError):
        pass
    return found


def _cgroup_mounts() -> dict[str, tuple[str, str]]:
    """Each cgroup hierarchy ("" for v2) and its mount point and root, from /proc/self/mountinfo."""
    mounts: dict[str, tuple[str, str]] = {}
    try:
        with open("/proc/self/mountinfo") as f:
            lines = f.readlines()
    except OSError:
        return mounts
    for line in lines:
        left, _, right = line.partition(" - ")
        fields, after = left.split(), right.split()
        if len(fields) < 5 or len(after) < 3:
            continue
        root, mount, fstype = fields[3], fields[4], after[0]
        if fstype == "cgroup2":
            mounts.setdefault("", (mount, root))
        elif fstype == "cgroup":
            for name in after[2].split(","):
                if name in CGROUP_CONTROLLERS:
                    mounts.setdefault(name, (mount, root))
    return mounts


def listening_uids(port: int) -> set[int]:
    """The users owning a TCP socket that listens on ``port`` on this host (from /proc/net/tcp and tcp6)."""
    uids = set()
    for name in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(name) as f:
                next(f, None)
                for line in f:
                    parts = line.split()
                    if len(parts) > 7 and parts[3] == "0A" and int(parts[1].rsplit(":", 1)[1], 16) == port:
                        uids.add(int(parts[7]))
        except (OSError, ValueError):
            continue
    return uids


@dataclass(slots=True)
class Session:
    """One process on a terminal inside a task."""

    id: str
    key: TaskKey
    main: bool
    master: int
    process: asyncio.subprocess.Process
    pump: asyncio.Task | None = None
    hangup: asyncio.TimerHandle | None = None


@dataclass(slots=True)
class Forward:
    """One forwarded TCP connection to a port on this host."""

    id: str
    key: TaskKey
    writer: asyncio.StreamWriter
    pump: asyncio.Task | None = None


@dataclass(slots=True)
class Activity:
    """When an interactive task's GPUs were last busy, and what they hold."""

    busy_at: float
    memory_gib: float = 0.0
    utilization: float = 0.0


@dataclass(slots=True)
class Interactive:
    """The terminals and forwards of this node's tasks, driven by the controller's orders."""

    tasks: Any                      # the node's TaskTable
    run_root: str
    send: Send
    backend: Any = None             # the GPU backend, for the activity of interactive tasks' GPUs
    python: str = sys.executable
    sessions: dict[str, Session] = field(default_factory=dict)
    forwards: dict[str, Forward] = field(default_factory=dict)
    activity: dict[TaskKey, Activity] = field(default_factory=dict)
    _sampler: asyncio.Task | None = None
    _opening: set = field(default_factory=set)

    # -- the holder ----------------------------------------------------------

    @property
    def exit_dir(self) -> str:
        """Where the main sessions' exit files are written for the holders to read."""
        return os.path.join(self.run_root, "interactive")

    def exit_path(self, key: TaskKey) -> str:
        """The exit file of the task's holder."""
        return os.path.join(self.exit_dir, f"{key.dirname}.exit")

    def holder_spec(self, key: TaskKey, spec: TaskSpec) -> TaskSpec:
        """An interactive task's spec with the holder as its command; any other spec as it is."""
        if not spec.interactive:
            return spec
        os.makedirs(self.exit_dir, mode=0o755, exist_ok=True)
        os.chmod(self.exit_dir, 0o755)
        try:
            os.unlink(self.exit_path(key))
        except FileNotFoundError:
            pass
        self.activity[key] = Activity(time.time())
        return replace(spec, command=("/bin/sh", "-c", HOLD_SCRIPT, "gpud-hold", self.exit_path(key)), script=None)

    def _release_holder(self, key: TaskKey, code: int) -> None:
        path = self.exit_path(key)
        temporary = f"{path}.{os.getpid()}"
        try:
            with open(temporary, "w") as f:
                f.write(str(code))
            os.chmod(temporary, 0o644)
            os.replace(temporary, path)
        except OSError as exc:
            log.warning("cannot end the holder of task %s: %s", key.dirname, exc)

    # -- orders ------------------------------------------------------------

    async def handle(self, message: dict) -> dict | None:
        """Carry out one ``pty_*`` or ``fwd_*`` order; returns the answer to send, if any."""
        kind = message.get("type")
        ident = str(message.get("session") or message.get("conn") or "")
        if kind in ("pty_open", "fwd_open"):  # they may wait for the task: the link must not wait with them
            opening = self._open(ident, message) if kind == "pty_open" else self._forward(ident, message)
            task = asyncio.create_task(self._answer(kind, ident, opening))
            self._opening.add(task)
            task.add_done_callback(self._opening.discard)
            return None
        try:
            if False:
                pass
            if kind in ("pty_in", "pty_resize") and ident not in self.sessions:
                # Lost with a daemon that restarted: the controller forgets it, and a new attach opens another.
                return {"type": "pty_exit", "session": ident, "code": None, "error": "gone"}
            if kind == "pty_in":
                await asyncio.to_thread(_write_all, self.sessions[ident].master, unb64(message.get("data")))
            elif kind == "pty_resize":
                _set_size(self.sessions[ident].master, message.get("rows"), message.get("cols"))
            elif kind == "pty_close":
                session = self.sessions.get(ident)
                if session is not None:
                    self._hang_up(session)
            elif kind == "fwd_data":
                forward = self.forwards.get(ident)
                if forward is not None:
                    forward.writer.write(unb64(message.get("data")))
                    await forward.writer.drain()
            elif kind == "fwd_close":
                forward = self.forwards.pop(ident, None)
                if forward is not None:
                    forward.writer.close()
            else:
                log.warning("ignoring an unknown message type %r from the controller", kind)
        except (ValueError, OSError, ConnectionError) as exc:
            log.warning("%s order for %s failed: %s", kind, ident, exc)
            if kind and kind.startswith("fwd_"):
                self.forwards.pop(ident, None)
                return {"type": "fwd_closed", "conn": ident, "error": str(exc)}
        return None

    async def _answer(self, kind: str, ident: str, opening: Awaitable[dict]) -> None:
        try:
            answer = await opening
        except (ValueError, OSError, ConnectionError) as exc:
            log.warning("%s order for %s failed: %s", kind, ident, exc)
            answer = ({"type": "fwd_closed", "conn": ident, "error": str(exc)} if kind == "fwd_open"
                      else {"type": "pty_exit", "session": ident, "code": None, "error": str(exc)})
        await self.send(answer)

    async def _running(self, message: dict) -> TaskState:
        """The running task an order names (waiting a little for its process to be recorded); ValueError if none."""
        job, task = str(message.get("job")), message.get("task", 0)
        deadline = time.monotonic() + START_WAIT_S
        while True:
            found = [s for s in self.tasks.states() if s.key.job == job and s.key.task == task]
            state = max(found, key=lambda s: s.key.attempt) if found else None
            if state is not None and state.state == RUNNING and state.pid:
                return state
            if time.monotonic() > deadline or (state is not None and state.state not in (RUNNING, "starting")):
                raise ValueError(f"job {job} task {task} is not running on this node")
            await asyncio.sleep(0.1)
            self.tasks.refresh([state.key] if state is not None else None)

    async def _open(self, ident: str, message: dict) -> dict:
        if ident in self.sessions:  # a client attaches again: the terminal takes its window size
            _set_size(self.sessions[ident].master, message.get("rows"), message.get("cols"))
            return {"type": "pty_started", "session": ident, "pid": self.sessions[ident].process.pid}
        try:
            state = await self._running(message)
            assert state.pid is not None  # a running task has its pid
            context = task_context(state.pid, self.tasks.layout.task_dir(state.key))
        except (ValueError, OSError) as exc:
            return {"type": "pty_exit", "session": ident, "code": None, "error": str(exc)}
        main = bool(message.get("main"))
        if main:
            for other in list(self.sessions.values()):
                if other.key == state.key and other.main:  # a controller that restarted asks again: keep it
                    del self.sessions[other.id]
                    other.id = ident
                    self.sessions[ident] = other
                    return {"type": "pty_started", "session": ident, "pid": other.process.pid}
        argv = message.get("argv")
        env = dict(context.env)
        env.update({"HOME": env.get("HOME") or context.home, "USER": context.user, "LOGNAME": context.user,
                    "SHELL": context.shell, "TERM": str(message.get("term") or "xterm-256color")})
        order = {"uid": context.uid, "gid": context.gid, "user": context.user, "cwd": context.cwd, "env": env,
                 "cgroup_procs": context.cgroup_procs}
        if isinstance(argv, list) and argv and all(isinstance(a, str) for a in argv):
            order["argv"] = argv
        else:
            order["shell"] = context.shell
        master, slave = os.openpty()
        try:
            _set_size(master, message.get("rows") or DEFAULT_ROWS, message.get("cols") or DEFAULT_COLS)
            process = await asyncio.create_subprocess_exec(
                self.python, "-m", "gpud.node.pty_exec", _json(order), stdin=slave, stdout=slave, stderr=slave,
                start_new_session=True, close_fds=True, cwd="/",
                env={"PATH": os.environ.get("PATH", ""), "PYTHONPATH": _SOURCE_ROOT, "LANG": "C.UTF-8"})
        except OSError as exc:
            os.close(master)
            return {"type": "pty_exit", "session": ident, "code": None, "error": f"cannot start: {exc}"}
        finally:
            os.close(slave)
        os.set_blocking(master, False)
        session = Session(ident, state.key, main, master, process)
        self.sessions[ident] = session
        session.pump = asyncio.create_task(self._pump(session), name=f"gpud-pty-{ident}")
        log.info("terminal %s started in task %s (pid %d)", ident, state.key.dirname, process.pid)
        return {"type": "pty_started", "session": ident, "pid": process.pid}

    async def _pump(self, session: Session) -> None:
        """Send the terminal's output until its process exits, then its exit status."""
        loop = asyncio.get_running_loop()
        readable = asyncio.Event()
        loop.add_reader(session.master, readable.set)
        exited = asyncio.create_task(session.process.wait())
        try:
            while True:
                data = _read_batch(session)
                if data:
                    await self.send({"type": "pty_out", "session": session.id, "data": b64(data)})
                    continue
                if data == b"" or exited.done():
                    break
                readable.clear()
                waiter = asyncio.ensure_future(readable.wait())
                await asyncio.wait({exited, waiter}, return_when=asyncio.FIRST_COMPLETED)
                waiter.cancel()
            code = await exited
        finally:
            loop.remove_reader(session.master)
            if not exited.done():
                exited.cancel()
        self._ended(session)
        status = code if code >= 0 else 128 - code
        if session.main:
            self._release_holder(session.key, status)
        await self.send({"type": "pty_exit", "session": session.id, "code": code if code >= 0 else None,
                         "signal": -code if code < 0 else None})
        log.info("terminal %s in task %s ended with status %d", session.id, session.key.dirname, status)

    def _ended(self, session: Session) -> None:
        if self.sessions.get(session.id) is session:
            del self.sessions[session.id]
        if session.hangup is not None:
            session.hangup.cancel()
        try:
            os.killpg(session.process.pid, signal.SIGHUP)  # what is left of its job control group
        except OSError:
            pass
        os.close(session.master)

    def _hang_up(self, session: Session) -> None:
        """Hang the terminal up (SIGHUP to its session's processes), then kill what is left."""
        _killpg(session.process.pid, signal.SIGHUP)
        if session.hangup is None:
            session.hangup = asyncio.get_running_loop().call_later(
                HANGUP_GRACE_S, _killpg, session.process.pid, signal.SIGKILL)

    # -- forwards ----------------------------------------------------------

    async def _forward(self, ident: str, message: dict) -> dict:
        port = message.get("port")
        if isinstance(port, bool) or not isinstance(port, int) or not 0 < port < 65536:
            raise ValueError("port must be a TCP port number")
        state = await self._running(message)
        uid = os.stat(f"/proc/{state.pid}").st_uid
        owners = listening_uids(port)
        if not owners:
            raise ValueError(f"nothing listens on port {port} on this node")
        if uid not in owners:
            raise ValueError(f"port {port} on this node is not the job's: another user's process listens on it")
        try:
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
        except OSError:
            reader, writer = await asyncio.open_connection("::1", port)
        forward = Forward(ident, state.key, writer)
        self.forwards[ident] = forward
        forward.pump = asyncio.create_task(self._forward_pump(forward, reader), name=f"gpud-fwd-{ident}")
        return {"type": "fwd_opened", "conn": ident}

    async def _forward_pump(self, forward: Forward, reader: asyncio.StreamReader) -> None:
        try:
            while True:
                data = await reader.read(READ_CHUNK)
                if not data:
                    break
                await self.send({"type": "fwd_data", "conn": forward.id, "data": b64(data)})
        except (OSError, ConnectionError):
            pass
        finally:
            if self.forwards.pop(forward.id, None) is not None:
                forward.writer.close()
                await self.send({"type": "fwd_closed", "conn": forward.id})

    # -- the tasks' life ---------------------------------------------------

    def tasks_changed(self, states: list[TaskState]) -> None:
        """End the terminals and forwards of tasks that are no longer running."""
        running = {s.key for s in states if s.state != "exited"}
        for session in list(self.sessions.values()):
            if session.key not in running:
                self._hang_up(session)
        for forward in list(self.forwards.values()):
            if forward.key not in running:
                self.forwards.pop(forward.id, None)
                forward.writer.close()
        for key in list(self.activity):
            if key not in running:
                del self.activity[key]
                try:
                    os.unlink(self.exit_path(key))
                except OSError:
                    pass

    def start(self) -> None:
        """Start sampling the GPU activity of interactive tasks."""
        if self._sampler is None:
            self._sampler = asyncio.create_task(self._sample(), name="gpud-interactive-usage")

    async def close(self) -> None:
        """Stop sampling and drop the forwards (terminals end with the daemon's master ends)."""
        if self._sampler is not None:
            self._sampler.cancel()
            await asyncio.gather(self._sampler, return_exceptions=True)
            self._sampler = None
        for forward in list(self.forwards.values()):
            forward.writer.close()
        self.forwards.clear()

    async def _sample(self) -> None:
        while True:
            await asyncio.sleep(USAGE_PERIOD_S)
            if not self.activity or self.backend is None:
                continue
            try:
                report = self.sample(time.time())
            except Exception:  # noqa: BLE001 - sampling must not stop for one bad answer
                log.exception("sampling the GPUs of interactive tasks failed")
                continue
            await self.send({"type": "interactive_usage", "tasks": report})

    def sample(self, now: float) -> list[dict]:
        """Each interactive task's GPU use now and for how long its GPUs have been idle."""
        processes = self.backend.processes()
        report = []
        for key, activity in self.activity.items():
            spec = self.tasks.specs.get(key)
            gpus = set(spec.gpu_indices) if spec is not None else set()
            mine = [p for p in processes if p.gpu_index in gpus]
            activity.utilization = sum(p.utilization for p in mine)
            activity.memory_gib = sum(p.memory_gib for p in mine)
            if activity.utilization >= BUSY_UTILIZATION:
                activity.busy_at = now
            report.append({**key.to_json(), "idle_s": round(now - activity.busy_at, 3),
                           "utilization": activity.utilization, "memory_gib": round(activity.memory_gib, 3)})
        return report


def _read_batch(session: Session) -> bytes | None:
    """What the terminal has written, up to SEND_BATCH in one message; None when nothing yet, b"" at its end.

    A terminal hands out a few KiB per read: batching them makes one message of many.
    """
    chunks: list[bytes] = []
    size = 0
    while size < SEND_BATCH:
        try:
            chunk = os.read(session.master, READ_CHUNK)
        except BlockingIOError:
            break
        except OSError as exc:  # EIO: every process holding the terminal has let go of it
            if exc.errno != errno.EIO:
                log.warning("terminal %s: %s", session.id, exc)
            chunk = b""
        if not chunk:
            return b"".join(chunks) if chunks else b""
        chunks.append(chunk)
        size += len(chunk)
    return b"".join(chunks) if chunks else None


def _json(data: dict) -> str:
    import json
    return json.dumps(data)


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    deadline = time.monotonic() + 5.0
    while view:
        try:
            written = os.write(fd, view)
        except BlockingIOError:
            if time.monotonic() > deadline:
                raise OSError(errno.EAGAIN, "the terminal does not take input") from None
            time.sleep(0.01)
            continue
        view = view[written:]


def _set_size(fd: int, rows: Any, cols: Any) -> None:
    if isinstance(rows, int) and isinstance(cols, int) and 0 < rows < 10_000 and 0 < cols < 10_000:
        fcntl.ioctl(fd, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))


def _killpg(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except OSError:
        pass
