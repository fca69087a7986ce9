"""The task supervisor (like slurmstepd): ``python -m gpud.node.supervisor --feed TASKS_DIR``.

Started by the node daemon in a session of its own, it reads orders on its
standard input, one JSON object per line: ``{"dir", "order"}`` starts a
task, ``{"stop": dir}`` says its stop file is written, ``{"forget": dir}``
deletes the directory of a task whose exit the daemon has passed on. It runs
each task as the job's user, enforces time limits, carries out stop requests
(the stop signal to the task's process group, SIGKILL after the grace
period), and records each task's exit in the task directory's state file.
It does not depend on the daemon staying alive: when the daemon goes away
the supervisor keeps its tasks to their end, and a restarted daemon reads
the state files, finds each task running or finished, and starts a
supervisor of its own for new tasks.

One supervisor serves every task a daemon starts: it spawns each task
directly, about a millisecond of CPU, where a Python process per task cost
ten times that. ``python -m gpud.node.supervisor TASK_DIR`` supervises the
one task whose order is in TASK_DIR.
"""

from __future__ import annotations

import os
import pwd
import select
import shutil
import signal
import socket
import subprocess
import sys
import time
import traceback
from contextlib import contextmanager
from dataclasses import dataclass, replace
from functools import partial

from gpud import jsontext
from gpud.node import cgroups, cgspares, failsafe, freezer, lease, procs
from gpud.node.spec import SpecError, TaskKey, TaskSpec, expand_path, signal_number, task_env
from gpud.node.taskstate import ORDER_FILE, RUNNING, STOP_FILE, TaskState, read_json, write_state
from gpud.wire.task import ExitCause

CLEANUP_POLL_S = 0.01  # how often what a finished task left behind is looked for again
SLICED_POLL_S = 0.5  # how often a time-sliced task's supervisor looks at the slicer's heartbeat
IDLE_POLL_S = 1.0
POKE_NAMES = 1000  # task names per poke datagram: well under the socket's datagram size
LOST_STATUS = -1  # the task was reaped by someone else: its exit code is unknown
CGROUPS_FILE = "cgroups"  # in the task directory: the task's cgroup directories, one per line
GIB = 1 << 30


@dataclass(frozen=True, slots=True)
class RunAs:
    """The identity a task runs with; ``switch`` is False when the supervisor is not root (it runs as itself)."""

    name: str
    uid: int
    gid: int
    groups: tuple[int, ...]
    home: str
    switch: bool


class StartError(Exception):
    """The task could not be started; the message becomes the reason "failed to start: ..."."""


USER_CACHE_S = 30.0  # how long a user's identity and groups are reused, as nscd would
_users: dict[str, tuple[float, RunAs]] = {}


def resolve_user(name: str) -> RunAs:
    """Who a task of user ``name`` runs as: that user when we are root, else the supervisor's own user.

    An answer is reused for USER_CACHE_S, so a burst of tasks of one user
    looks the user and their groups up once.
    """
    now = time.monotonic()
    cached = _users.get(name)
    if cached is not None and cached[0] > now:
        return cached[1]
    who = _lookup_user(name)
    _users[name] = (now + USER_CACHE_S, who)
    return who


def _lookup_user(name: str) -> RunAs:
    if os.geteuid() != 0:
        me = pwd.getpwuid(os.geteuid())
        return RunAs(me.pw_name, me.pw_uid, me.pw_gid, tuple(os.getgroups()), me.pw_dir, False)
    try:
        pw = pwd.getpwnam(name)
    except KeyError:
        raise StartError(f"unknown user {name!r} on this node") from None
    return RunAs(pw.pw_name, pw.pw_uid, pw.pw_gid, tuple(os.getgrouplist(pw.pw_name, pw.pw_gid)), pw.pw_dir,
                 pw.pw_uid != 0)


@contextmanager
def acting_as(who: RunAs):
    """Run the block with ``who``'s effective ids, so file access is checked as for the job's user."""
    if not who.switch:
        yield
        return
    saved = os.getgroups()
    os.setgroups(list(who.groups))
    os.setegid(who.gid)
    os.seteuid(who.uid)
    try:
        yield
    finally:
        os.seteuid(0)
        os.setegid(0)
        os.setgroups(saved)


class TaskRun:
    """One task under a supervisor: started, watched, stopped, cleaned up and recorded in its task directory."""

    def __init__(self, task_dir: str, order: dict, owner: tuple[int, int | None], notify: Notifier,
                 confiner: cgroups.Confiner | None = None, spares: cgspares.Spares | None = None) -> None:
        self.task_dir = task_dir
        self.confiner = confiner
        self.spares = spares
        self.cgroup: cgroups.TaskCgroup | None = None
        self.limits = cgroups.Limits()
        self.pinned: list[int] = []
        self.memory_limit: int | None = None
        self.usage: dict = {}
        self.key = TaskKey.from_order(order["key"])
        self.notify = notify
        self.state = TaskState(self.key, supervisor_pid=owner[0], supervisor_start=owner[1])
        self.spec: TaskSpec = TaskSpec.decode(order["spec"], error=SpecError)
        self.checkpoint_dir: str = order["checkpoint_dir"]
        self.stopping_reason: str | None = None
        self.stopping_cause = ExitCause.STOPPED  # what the exit says once stopping_reason is set
        self.kill_at: float | None = None
        self.deadline: float | None = None
        self.warned = False  # the job's --signal went ahead of its time limit
        self.next_thaw_check = 0.0
        self.leader_status: int | None = None
        self.leader_exited: float | None = None  # when the leader was reaped: the task's end, whatever lingers
        self.pid = 0
        self.proc: subprocess.Popen | None = None
        self._stop_seen: tuple[int, int] | None = None
        run_root = os.path.dirname(os.path.dirname(os.path.abspath(task_dir)))
        self.heartbeat = failsafe.heartbeat_path(run_root)
        self.lease_file = lease.lease_path(run_root)

    # -- recording ---------------------------------------------------------

    def _record(self, state: TaskState) -> None:
        self.state = state
        try:
            write_state(self.task_dir, state)
        except FileNotFoundError:  # someone deleted the task's directory: the state is still worth keeping
            _make_dir(self.task_dir, 0o700)
            write_state(self.task_dir, state)
        self.notify(self.key)

    # -- starting ----------------------------------------------------------

    def _argv(self, who: RunAs) -> tuple[list[str], int | None]:
        """The task's command line, and the open script it names (None for a command).

        The task directory is root's alone (0700): the job's user runs its
        script through an open descriptor (/dev/fd/N), never by its path.
        """
        if self.spec.command is not None:
            return list(self.spec.command), None
        path = os.path.join(self.task_dir, "script")
        with open(path, "w", encoding="utf-8") as f:
            f.write(self.spec.script or "")
        os.chmod(path, 0o500)
        if who.switch:
            os.chown(path, who.uid, who.gid)
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        shown = f"/dev/fd/{fd}"
        return ([shown] if (self.spec.script or "").startswith("#!") else ["/bin/sh", shown]), fd

    def _open_outputs(self, who: RunAs) -> tuple[int, int]:
        out_path = expand_path(self.spec.output, self.spec.workdir, self.key)
        err_path = expand_path(self.spec.error, self.spec.workdir, self.key) if self.spec.error else out_path
        flags = os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC
        with acting_as(who):
            try:
                os.chdir(self.spec.workdir)
            except OSError as exc:
                raise StartError(f"cannot enter workdir {self.spec.workdir}: {exc.strerror}") from None
            finally:
                os.chdir("/")
            try:
                out = _open_making_dirs(out_path, flags)
                err = out if err_path == out_path else _open_making_dirs(err_path, flags)
            except OSError as exc:
                raise StartError(f"cannot open {exc.filename}: {exc.strerror}") from None
        return out, err

    def _prepare_checkpoint_dir(self, who: RunAs) -> None:
        _make_dir(self.checkpoint_dir, 0o700)
        os.chmod(self.checkpoint_dir, 0o700)  # the job's user alone, whatever made it
        if who.switch:
            os.chown(self.checkpoint_dir, who.uid, who.gid)

    def begin(self) -> bool:
        """Start the task unless a stop came first; False when it has already ended (stopped or failed to start)."""
        if os.path.exists(os.path.join(self.task_dir, STOP_FILE)):
            request = read_json(os.path.join(self.task_dir, STOP_FILE)) or {}
            reason, cause = _stop_cause(request)
            self._record(self.state.exited(reason=reason, cause=cause, ended=time.time()))
            return False
        try:
            self.start()
        except StartError as exc:
            self._record(self.state.exited(reason=f"failed to start: {exc}", cause=ExitCause.FAILED_TO_START,
                                           ended=time.time()))
            return False
        except Exception as exc:  # noqa: BLE001 - any other failure is still this task's failed start
            traceback.print_exc()
            self._record(self.state.exited(reason=f"failed to start: {type(exc).__name__}: {exc}",
                                           cause=ExitCause.FAILED_TO_START, ended=time.time()))
            return False
        return True

    def start(self) -> None:
        """Start the task's process in its own session as the job's user; StartError if it cannot start."""
        who = resolve_user(self.spec.user)
        if who.uid == 0 and not self.spec.allow_root:
            raise StartError(f"user {who.name!r} is uid 0 on this node, and jobs run as root only for a token "
                             f"created with --allow-root")
        self._prepare_checkpoint_dir(who)
        argv, script_fd = self._argv(who)
        try:
            out, err = self._open_outputs(who)
        except StartError:
            if script_fd is not None:
                os.close(script_fd)
            raise
        env = task_env(self.spec, self.key, self.checkpoint_dir, who.home, who.name)
        try:
            self._confine()
        except BaseException:
            for fd in {out, err, *([] if script_fd is None else [script_fd])}:
                os.close(fd)
            raise

        def fork() -> subprocess.Popen:
            return subprocess.Popen(
                argv, cwd=self.spec.workdir, env=env, stdin=subprocess.DEVNULL, stdout=out, stderr=err,
                start_new_session=True, close_fds=True, pass_fds=() if script_fd is None else (script_fd,),
                user=who.uid if who.switch else None, group=who.gid if who.switch else None,
                extra_groups=list(who.groups) if who.switch else None)

        try:
            proc = fork() if self.cgroup is None or self.confiner is None else self.confiner.spawn(self.cgroup, fork)
        except BaseException as exc:
            self._unconfine()  # nothing runs in its cgroups: they go now, not with a task that never was
            if isinstance(exc, cgroups.Refused):
                raise StartError(f"cannot move the task into its cgroups: {exc.reason}") from None
            if isinstance(exc, OSError):
                raise StartError(f"cannot run {argv[0]}: {exc.strerror or exc}") from None
            if isinstance(exc, subprocess.SubprocessError):
                raise StartError(str(exc)) from None
            raise
        finally:
            os.close(out)
            if err != out:
                os.close(err)
            if script_fd is not None:
                os.close(script_fd)
        self.proc = proc
        self.pid = proc.pid
        if self.spec.time_limit_s:
            self.deadline = time.monotonic() + self.spec.time_limit_s
        if self.spec.sliced:
            freezer.make_task_cgroup(self.task_dir, f"{self.key.dirname}-{proc.pid}", proc.pid)
        self._record(replace(self.state, state=RUNNING, pid=proc.pid,
                             pid_start=procs.start_ticks(proc.pid), started=time.time()))

    def _confine(self) -> None:
        """Make the task's cgroups, for the task to start in; StartError when the host refuses."""
        if self.confiner is None or not self.confiner.hierarchies.tracked():
            return
        self.pinned = self.confiner.pick_cpus(self.spec.cpus, self.spec.near_cpus)
        # Pinned to exactly as many CPUs as it asked for, a task needs no CPU quota on top.
        exact = bool(self.pinned) and len(self.pinned) == self.spec.cpus
        # A time-sliced task is frozen in a freezer group of its own (gpud.node.freezer): not in two at once.
        skip = (*(("cpu",) if exact else ()), *(("freezer",) if self.spec.sliced else ()))
        self.cgroup = cgroups.TaskCgroup(cgroups.cgroup_name(os.path.dirname(self.task_dir), self.key.dirname),
                                         self.confiner.hierarchies, skip=skip)
        self.memory_limit = int(self.spec.memory_gib * GIB) if self.spec.memory_gib > 0 else None
        limits = self.limits = cgroups.Limits(memory_bytes=self.memory_limit, cpus=self.spec.cpus or None,
                                              cpuset=",".join(map(str, self.pinned)) or None,
                                              gpu_minors=tuple(self.spec.gpu_indices), pids_max=self.spec.pids_max)
        try:
            with open(os.path.join(self.task_dir, CGROUPS_FILE), "w", encoding="utf-8") as f:
                f.write("".join(f"{path}\n" for path in self.cgroup.paths()))
            self.cgroup.create(limits, v1_ready=self.spares is not None and self.spares.take(self.cgroup, limits))
        except OSError as exc:
            self._unconfine()
            raise StartError(f"cannot make the task's cgroup: {exc.strerror or exc}") from None

    def _unconfine(self) -> None:
        """Remove the cgroups of a task that did not start, and give back its CPUs."""
        if self.cgroup is not None:
            self.cgroup.remove()
        if self.confiner is not None:
            self.confiner.release_cpus(self.pinned)
        self.cgroup, self.pinned = None, []

    # -- stopping ----------------------------------------------------------

    def _thaw(self) -> None:
        """Let the task run: a frozen task would not act on its stop signal (nor, in a v1 cgroup, die)."""
        if self.spec.sliced:
            freezer.freezer_for(self.task_dir, self.pid).thaw()

    def _begin_stop(self, reason: str, cause: ExitCause, sig: int, grace_s: float, leader_only: bool = False,
                    hasten: bool = False) -> None:
        now = time.monotonic()
        if self.stopping_reason is None:
            self.stopping_reason, self.stopping_cause = reason, cause
            if self.spec.sliced:
                failsafe.mark_stopping(self.task_dir)
                self._thaw()
            if leader_only:
                self._signal_leader(sig)
                self.kill_at = min(self.kill_at or now + grace_s, now + grace_s)
                return
            procs.signal_group(self.pid, sig)
            if self.cgroup is not None:
                # What left the process group hears it too; what is in it heard it once already. A second
                # stop signal may cut a job's handler short (many take it to mean "quit now, skip saving").
                self.cgroup.signal(sig, besides_group=self.pid)
        if self.kill_at is None or hasten:
            # The grace the first stop gave holds: a stop said again (perhaps with a shorter grace, after a
            # policy reload) must not cut short the job's checkpoint, unless the job itself reported one.
            self.kill_at = min(self.kill_at or now + grace_s, now + grace_s)

    def _signal_leader(self, sig: int) -> None:
        """Send ``sig`` to the task's first process alone (``--signal B:SIG@LEAD``)."""
        try:
            os.kill(self.pid, sig)
        except OSError:
            pass

    def _warn(self) -> None:
        """Send the job's ``--signal`` ahead of its time limit, once."""
        self.warned = True
        try:
            sig = signal_number(self.spec.warn_signal or "USR1")
        except ValueError:
            return
        if self.spec.warn_batch_only:
            self._signal_leader(sig)
            return
        procs.signal_group(self.pid, sig)
        if self.cgroup is not None:
            self.cgroup.signal(sig, besides_group=self.pid)

    def fence(self, grace_s: float) -> None:
        """The node's lease ran out: stop the task (its stop signal, SIGKILL after at most ``grace_s``)."""
        if self.stopping_reason is not None or self.leader_status is not None:
            return
        try:
            sig = signal_number(self.spec.stop_signal)
        except ValueError:
            sig = signal.SIGTERM
        self._begin_stop(lease.FENCED_REASON, ExitCause.FENCED, sig, max(0.0, min(self.spec.grace_s, grace_s)))

    def look_at_stop_request(self, *, even_without_file: bool = False) -> None:
        """Carry out the stop request in the task directory, if there is a new one (or, when asked, the default stop)."""
        path = os.path.join(self.task_dir, STOP_FILE)
        try:
            info = os.stat(path)
            seen = (info.st_ino, info.st_mtime_ns)  # a new request is a new file: written aside, then renamed
        except OSError:
            seen = None
        if seen is None and not even_without_file:
            return
        if seen is not None and seen == self._stop_seen and not even_without_file:
            return
        self._stop_seen = seen
        request = (read_json(path) if seen is not None else None) or {}
        try:
            sig = signal_number(request.get("signal") or self.spec.stop_signal)
        except ValueError:
            sig = signal.SIGTERM
        grace = request.get("grace_s")
        grace = float(grace) if isinstance(grace, (int, float)) and grace >= 0 else self.spec.grace_s
        self._begin_stop(*_stop_cause(request), sig, grace, request.get("leader_only") is True,
                         request.get("hasten") is True)

    def _kill(self, strays: list[int]) -> int:
        """SIGKILL the task's process group, its leader's descendants and ``strays``; returns how many were signalled."""
        self._thaw()
        procs.signal_group(self.pid, signal.SIGKILL)
        count = 0
        for pid in [*procs.descendants(self.pid), *strays, *(d for s in strays for d in procs.descendants(s))]:
            try:
                os.kill(pid, signal.SIGKILL)
                count += 1
            except OSError:
                pass
        if self.cgroup is not None:
            count += self.cgroup.kill()
        return count

    # -- watching ----------------------------------------------------------

    def tick(self, now: float, strays: list[int]) -> float | None:
        """Enforce the time limit, the grace period and the slicer's fail-safe; returns when to look again."""
        warn_at = self._warn_at()
        if warn_at is not None and now >= warn_at and self.stopping_reason is None:
            self._warn()
        if self.deadline is not None and now >= self.deadline and self.stopping_reason is None:
            self._begin_stop("timeout", ExitCause.TIMEOUT, signal_number(self.spec.stop_signal), self.spec.grace_s)
        if self.spec.sliced and now >= self.next_thaw_check:
            self.next_thaw_check = now + SLICED_POLL_S
            if self.stopping_reason is not None or failsafe.silent(self.heartbeat):
                self._thaw()
        if self.kill_at is not None and now >= self.kill_at:
            self._kill(strays)
            self.kill_at = None
        wakes = [t for t in (self.deadline if self.stopping_reason is None else None, self.kill_at,
                             self._warn_at() if self.stopping_reason is None else None) if t is not None]
        if self.spec.sliced:
            wakes.append(self.next_thaw_check)
        return min(wakes) if wakes else None

    def _warn_at(self) -> float | None:
        """When the job's ``--signal`` is due (LEAD seconds before the time limit); None when not (any more)."""
        if self.warned or self.spec.warn_signal is None or self.deadline is None:
            return None
        return self.deadline - self.spec.warn_lead_s

    def clean_up(self, strays: list[int]) -> bool:
        """Kill whatever the task left behind (its process group, its orphans); True once all of it is gone."""
        if self.spec.sliced:
            failsafe.mark_stopping(self.task_dir)  # the slicer must not freeze what is being killed
        left = self._kill(strays)  # counts what was still in the task's cgroups too
        if left or procs.group_alive(self.pid):
            return False
        if self.cgroup is not None:
            self.usage = self.cgroup.stats()  # the empty cgroups are removed once the exit is reported
            if self.confiner is not None:
                self.confiner.release_cpus(self.pinned)
            self.pinned = []
        if self.spec.sliced:
            freezer.remove_task_cgroup(self.task_dir)
        return True

    def finish(self) -> None:
        """Record the task's exit code or terminating signal, why it ended, and what it used."""
        used = replace(self.state, max_rss_bytes=self.usage.get("max_rss_bytes"), cpu_s=self.usage.get("cpu_s"))
        reason, cause = self.stopping_reason, self.stopping_cause
        if reason is None and self.usage.get("oom_kills") and self.memory_limit:
            reason = f"out of memory (limit {cgroups.format_bytes(self.memory_limit)})"
            cause = ExitCause.OUT_OF_MEMORY
        if self.leader_status == LOST_STATUS:
            if reason is None:
                reason, cause = "exit status lost", ExitCause.STATUS_LOST
            self._record(used.exited(reason=reason, cause=cause, ended=time.time()))
            return
        code = os.waitstatus_to_exitcode(self.leader_status or 0)
        self._record(used.exited(exit_code=code if code >= 0 else None, term_signal=-code if code < 0 else None,
                                 reason=reason or "", cause=cause if reason is not None else ExitCause.EXITED,
                                 ended=self.leader_exited or time.time()))


class Notifier:
    """Pokes the daemon's datagram socket when tasks change state (the daemon may be away: then nothing).

    Calls only note the task; :meth:`flush` sends the tasks noted since the
    last flush in one datagram (their directory names, one per line), so a
    burst of starts and exits wakes the daemon once.
    """

    def __init__(self) -> None:
        self.path: str | None = None
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self._sock.setblocking(False)
        self._noted: dict[TaskKey, None] = {}

    def __call__(self, key: TaskKey) -> None:
        if self.path:
            self._noted[key] = None

    def flush(self) -> None:
        """Send the tasks noted so far."""
        names, self._noted = [key.dirname for key in self._noted], {}
        if self.path is None:  # nothing was noted
            return
        for first in range(0, len(names), POKE_NAMES):
            try:
                self._sock.sendto("\n".join(names[first:first + POKE_NAMES]).encode(), self.path)
            except OSError:
                pass  # the daemon is away or busy; it reads the state files when it looks


class Supervisor:
    """Supervises tasks until its feed has ended and its last task is over.

    ``feed`` is the pipe start orders come on (one JSON object per line:
    ``{"dir": TASK_DIR, "order": {...}}``; ``{"stop": TASK_DIR}`` once the
    task's stop file is written), or None for a supervisor of the tasks given
    to :meth:`run`. SIGUSR1 makes it look at its tasks' stop files; SIGTERM
    or SIGINT stops every task.
    """

    def __init__(self, feed: int | None = None) -> None:
        self.feed = feed
        self.owner = (os.getpid(), procs.start_ticks(os.getpid()))
        self.notify = Notifier()
        self.confiner = cgroups.Confiner()
        self.spares = cgspares.Spares()
        self.runs: dict[TaskKey, TaskRun] = {}
        self.by_pid: dict[int, TaskRun] = {}
        self._buffer = b""
        self._look_at_stops = False
        self._terminate = False
        self._next_lease_check = 0.0
        # Empty cgroups of finished tasks, with their limits and whether they may serve another task: to keep
        # as spares or remove.
        self._doomed: list[tuple[cgroups.TaskCgroup, cgroups.Limits, bool]] = []

    def add(self, task_dir: str, order: object, *, announce: bool = False) -> None:
        """Take on the task whose order is ``order`` and start it (or record why it could not start).

        With ``announce``, the supervisor's pid is recorded before the stop
        file is looked at: whoever writes a stop file and then finds no pid
        recorded knows the supervisor will still see it.
        """
        try:
            _make_dir(task_dir, 0o700)
            run = TaskRun(task_dir, order, self.owner, self.notify, self.confiner,  # type: ignore[arg-type]
                          self.spares)
        except (KeyError, TypeError, ValueError, OSError) as exc:
            print(f"gpud supervisor: ignoring the order for {task_dir}: {exc}", file=sys.stderr, flush=True)
            return
        if isinstance(order, dict) and isinstance(order.get("notify"), str):
            self.notify.path = order["notify"]
        if run.key in self.runs:
            return
        if self.feed is not None:
            # Written in place: it is written once, before the state file that tells anyone to read it.
            # Readable by root alone: it holds the job's command and environment (tokens, say).
            fd = os.open(os.path.join(task_dir, ORDER_FILE), os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC,
                         0o600)
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                os.fchmod(fd, 0o600)
                f.write(jsontext.dumps(order))
        if announce:
            write_state(task_dir, run.state)
        if run.begin():
            self.runs[run.key] = run
            self.by_pid[run.pid] = run

    def forget(self, task_dir: str) -> None:
        """Delete the directory of a task that has ended and whose exit the daemon has passed on."""
        key = TaskKey.from_dirname(os.path.basename(task_dir))
        if key is None or key in self.runs:
            return  # not a task directory, or one still supervised (its exit is not recorded yet)
        shutil.rmtree(task_dir, ignore_errors=True)

    # -- the loop ----------------------------------------------------------

    def _on_signal(self, signum, frame) -> None:
        if signum == signal.SIGUSR1:
            self._look_at_stops = True
        else:
            self._terminate = True

    def _read_feed(self) -> None:
        assert self.feed is not None  # read only while it is open
        try:
            data = os.read(self.feed, 1 << 16)
        except BlockingIOError:
            return
        if not data:
            os.close(self.feed)
            self.feed = None
            return
        *lines, self._buffer = (self._buffer + data).split(b"\n")
        for line in lines:
            try:
                message = jsontext.loads(line)
                if "stop" in message:
                    stopped = TaskKey.from_dirname(os.path.basename(message["stop"]))
                    run = self.runs.get(stopped) if stopped is not None else None
                    if run is not None and run.leader_status is None:
                        run.look_at_stop_request()
                elif "forget" in message:
                    self.forget(message["forget"])
                else:
                    self.add(message["dir"], message["order"])
            except (ValueError, KeyError, TypeError) as exc:
                print(f"gpud supervisor: ignoring a bad order line: {exc}", file=sys.stderr, flush=True)

    def _reap(self) -> None:
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                for run in self.runs.values():
                    if run.leader_status is None:
                        run.leader_status = LOST_STATUS
                return
            if pid == 0:
                return
            leader = self.by_pid.pop(pid, None)
            if leader is not None:
                leader.leader_status, leader.leader_exited = status, time.time()
                if leader.proc is not None:
                    leader.proc.returncode = os.waitstatus_to_exitcode(status)  # so Popen never waits for it again

    def _strays(self) -> dict[TaskKey | None, list[int]]:
        """Our children that lead no task (orphans of the tasks), by the task they came from (None: unknown)."""
        found: dict[TaskKey | None, list[int]] = {}
        for pid in procs.children(os.getpid()):
            if pid in self.by_pid:
                continue
            found.setdefault(self._owner_of(pid), []).append(pid)
        return found

    def _owner_of(self, pid: int) -> TaskKey | None:
        # An orphan keeps its task's session unless it made its own; then the
        # variables gpud gave its task still name it.
        try:
            sid = os.getsid(pid)
        except OSError:
            return None
        for run in self.runs.values():
            if run.pid == sid:
                return run.key
        marks = procs.environ_marks(pid, ("GPUD_JOB_ID", "GPUD_TASK_INDEX", "GPUD_RESTART_COUNT"))
        try:
            key = TaskKey(marks["GPUD_JOB_ID"], int(marks["GPUD_TASK_INDEX"]), int(marks["GPUD_RESTART_COUNT"]))
        except (KeyError, ValueError):
            return None
        return next((known for known in self.runs if known.same_task(key)), None)

    def _step(self, now: float) -> float:
        """One pass over the tasks; returns when the next pass is due."""
        self._reap()
        terminate, look = self._terminate, self._look_at_stops or self._terminate
        self._look_at_stops = self._terminate = False
        strays = self._strays() if any(run.leader_status is not None or run.kill_at is not None
                                        for run in self.runs.values()) else {}
        unowned = strays.get(None, [])
        wake = now + IDLE_POLL_S
        if self.runs:
            wake = min(wake, self._check_lease(now))
        for key, run in list(self.runs.items()):
            try:
                if look and run.leader_status is None:
                    run.look_at_stop_request(even_without_file=terminate)
                wake = min(wake, self._advance(run, now, strays.get(key, []) + unowned))
            except Exception:  # noqa: BLE001 - one task's trouble (a full disk, say) must not end the others'
                traceback.print_exc()
                sys.stderr.flush()
        return wake

    def _check_lease(self, now: float) -> float:
        """Stop every task once the node's lease has run out; returns when to look at the lease again."""
        if now >= self._next_lease_check:
            self._next_lease_check = now + lease.CHECK_S
            for path in {run.lease_file for run in self.runs.values()}:
                held = lease.read_lease(path)
                if held is None or not held.expired(now):
                    continue
                for run in self.runs.values():
                    if run.lease_file == path and run.stopping_reason is None and run.leader_status is None:
                        print(f"gpud supervisor: the node's lease ran out; stopping task {run.key.dirname}",
                              file=sys.stderr, flush=True)
                        run.fence(held.grace_s)
        return self._next_lease_check

    def _advance(self, run: TaskRun, now: float, strays: list[int]) -> float:
        """Move one task on (its timers, or cleaning up after it); returns when it needs looking at again."""
        if run.leader_status is None:
            due = run.tick(now, strays)
            return due if due is not None else now + IDLE_POLL_S
        if not run.clean_up(strays):
            return now + CLEANUP_POLL_S
        run.finish()
        del self.runs[run.key]
        if run.cgroup is not None:
            self._doomed.append((run.cgroup, run.limits, not run.usage.get("oom_kills")))
        return now + IDLE_POLL_S

    def run(self, tasks: tuple[tuple[str, dict], ...] = ()) -> int:
        """Take on ``tasks`` (directory and order), supervise until the feed has ended and every task is over.

        Returns the exit status.
        """
        procs.become_subreaper()
        for signum in (signal.SIGUSR1, signal.SIGTERM, signal.SIGINT):
            signal.signal(signum, self._on_signal)
        # Handlers rather than SIG_IGN: an ignored signal would stay ignored in the tasks after exec.
        signal.signal(signal.SIGHUP, lambda *_: None)
        signal.signal(signal.SIGCHLD, lambda *_: None)
        rfd, wfd = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        signal.set_wakeup_fd(wfd, warn_on_full_buffer=False)
        if self.feed is not None:
            os.set_blocking(self.feed, False)
        for task_dir, order in tasks:
            self.add(task_dir, order, announce=True)
        wake = time.monotonic()
        while self.feed is not None or self.runs or self._doomed:
            self.notify.flush()
            doomed, self._doomed = self._doomed, []
            for group, limits, reusable in doomed:  # after the exits are reported, off this loop: it is slow
                self.confiner.later(partial(self.spares.park, group, limits, reusable))
            readable, _, _ = select.select([rfd] + ([self.feed] if self.feed is not None else []), [], [],
                                           max(0.0, wake - time.monotonic()))
            if rfd in readable:
                try:
                    while os.read(rfd, 512):
                        pass
                except BlockingIOError:
                    pass
            if self.feed is not None and self.feed in readable:
                self._read_feed()
            wake = self._step(time.monotonic())
        self.notify.flush()
        self.confiner.close()
        self.spares.clear()
        # Whatever is left is a stray of a finished task.
        for pid in procs.children(os.getpid()):
            procs.kill_tree(pid)
        return 0


def _make_dir(path: str, mode: int) -> None:
    """Make directory ``path`` (and missing parents) unless it exists: one system call when it is new."""
    try:
        os.mkdir(path, mode)
    except FileExistsError:
        pass
    except FileNotFoundError:
        os.makedirs(path, mode=mode, exist_ok=True)


# The stops whose own words become the task's exit reason; any other stop's exit reason is "stopped".
_WORDED_STOPS = (ExitCause.TIMEOUT, ExitCause.GPU_MEMORY)


def _stop_cause(request: dict) -> tuple[str, ExitCause]:
    """The exit reason and cause a stop request leaves: its cause (STOPPED when it names none), and for a
    time limit or the memory watchdog its own words, else "stopped"."""
    named = request.get("cause")
    cause = ExitCause(named) if isinstance(named, str) and named in ExitCause.__members__.values() \
        else ExitCause.STOPPED
    words = request.get("reason")
    if cause in _WORDED_STOPS and isinstance(words, str) and words:
        return words, cause
    return "stopped", cause


def _open_making_dirs(path: str, flags: int) -> int:
    """Open an output file, making its missing directories first (as the task's user, inside its workdir).

    Tools that name a directory per job in ``-o`` (submitit's ``%j/``) make
    it once the submit returns; a job that starts before then still runs.
    """
    try:
        return os.open(path, flags, 0o644)
    except FileNotFoundError:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        return os.open(path, flags, 0o644)


def main(argv: list[str] | None = None) -> int:
    """Entry point: ``--feed TASKS_DIR`` (orders on standard input) or one TASK_DIR whose order is written."""
    args = sys.argv[1:] if argv is None else argv
    if not (len(args) == 1 and not args[0].startswith("-")) and not (len(args) == 2 and args[0] == "--feed"):
        print("usage: python -m gpud.node.supervisor --feed TASKS_DIR | TASK_DIR", file=sys.stderr)
        return 2
    os.umask(0o022)
    if args[0] == "--feed":
        # TASKS_DIR is only named, so that `ps` shows which node's tasks this process supervises.
        return Supervisor(feed=sys.stdin.fileno()).run()
    order = read_json(os.path.join(args[0], ORDER_FILE))
    if not isinstance(order, dict):
        print(f"gpud supervisor: no readable {ORDER_FILE} in {args[0]}", file=sys.stderr)
        return 2
    return Supervisor().run(((args[0], order),))


if __name__ == "__main__":
    sys.exit(main())

