"""The per-task supervisor (like slurmstepd): ``python -m gpud.node.supervisor TASK_DIR``.

Started by the node daemon in a session of its own, it runs one task as the
job's user, enforces the time limit, carries out stop requests (the stop
signal to the task's process group, SIGKILL after the grace period), and
records the task's exit in the task directory's state file. It does not
depend on the daemon staying alive: a daemon that restarts reads the state
file and finds the task running or finished.
"""

from __future__ import annotations

import gc
import os
import pwd
import select
import signal
import socket
import subprocess
import sys
import time
from contextlib import contextmanager
from dataclasses import dataclass, replace

from gpud.node import failsafe, freezer, procs
from gpud.node.spec import TaskKey, TaskSpec, expand_path, parse_spec, signal_number, task_env
from gpud.node.taskstate import ORDER_FILE, RUNNING, STOP_FILE, TaskState, read_json, write_state

CLEANUP_POLL_S = 0.01
SLICED_POLL_S = 0.5  # how often a time-sliced task's supervisor looks at the slicer's heartbeat
LOST_STATUS = -1  # the task was reaped by someone else: its exit code is unknown


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


def resolve_user(name: str) -> RunAs:
    """Who a task of user ``name`` runs as: that user when we are root, else the supervisor's own user."""
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


class Supervisor:
    """Runs the task described in ``task_dir``/task.json to its end and records what happened."""

    def __init__(self, task_dir: str) -> None:
        self.task_dir = task_dir
        order = read_json(os.path.join(task_dir, ORDER_FILE))
        if not isinstance(order, dict):
            raise SystemExit(f"gpud supervisor: no readable {ORDER_FILE} in {task_dir}")
        self.key = TaskKey.from_order(order["key"])
        self.spec: TaskSpec = parse_spec(order["spec"])
        self.checkpoint_dir: str = order["checkpoint_dir"]
        self.notify_path: str | None = order.get("notify")
        self.state = TaskState(self.key, supervisor_pid=os.getpid(), supervisor_start=procs.start_ticks(os.getpid()))
        self.stop_requested = False
        self.stopping_reason: str | None = None
        self.kill_at: float | None = None
        self.leader_status: int | None = None
        self.pid = 0
        self.proc = None
        self.heartbeat = failsafe.heartbeat_path(os.path.dirname(os.path.dirname(os.path.abspath(task_dir))))

    # -- recording ---------------------------------------------------------

    def _record(self, state: TaskState) -> None:
        self.state = state
        write_state(self.task_dir, state)
        if self.notify_path:
            try:
                with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as s:
                    s.sendto(self.key.dirname.encode(), self.notify_path)
            except OSError:
                pass  # the daemon is away; it reads the state file when it comes back

    # -- starting ----------------------------------------------------------

    def _argv(self, who: RunAs) -> list[str]:
        if self.spec.command is not None:
            return list(self.spec.command)
        path = os.path.join(self.task_dir, "script")
        with open(path, "w", encoding="utf-8") as f:
            f.write(self.spec.script or "")
        os.chmod(path, 0o500)
        if who.switch:
            os.chown(path, who.uid, who.gid)
        return [path] if (self.spec.script or "").startswith("#!") else ["/bin/sh", path]

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
                out = os.open(out_path, flags, 0o644)
                err = out if err_path == out_path else os.open(err_path, flags, 0o644)
            except OSError as exc:
                raise StartError(f"cannot open {exc.filename}: {exc.strerror}") from None
        return out, err

    def _prepare_checkpoint_dir(self, who: RunAs) -> None:
        os.makedirs(self.checkpoint_dir, mode=0o700, exist_ok=True)
        if who.switch:
            os.chown(self.checkpoint_dir, who.uid, who.gid)

    def start(self) -> None:
        """Start the task's process in its own session as the job's user; StartError if it cannot start."""
        who = resolve_user(self.spec.user)
        self._prepare_checkpoint_dir(who)
        argv = self._argv(who)
        out, err = self._open_outputs(who)
        env = task_env(self.spec, self.key, self.checkpoint_dir, who.home, who.name)
        try:
            proc = subprocess.Popen(
                argv, cwd=self.spec.workdir, env=env, stdin=subprocess.DEVNULL, stdout=out, stderr=err,
                start_new_session=True, close_fds=True,
                user=who.uid if who.switch else None, group=who.gid if who.switch else None,
                extra_groups=list(who.groups) if who.switch else None)
        except OSError as exc:
            raise StartError(f"cannot run {argv[0]}: {exc.strerror or exc}") from None
        except subprocess.SubprocessError as exc:
            raise StartError(str(exc)) from None
        finally:
            os.close(out)
            if err != out:
                os.close(err)
        # Kept so that Popen.__del__ never reaps the task behind our back: we wait for it ourselves.
        self.proc = proc
        self.pid = proc.pid
        if self.spec.sliced:
            freezer.make_task_cgroup(self.task_dir, f"{self.key.dirname}-{proc.pid}", proc.pid)
        self._record(replace(self.state, state=RUNNING, pid=proc.pid,
                                     pid_start=procs.start_ticks(proc.pid), started=time.time()))

    # -- running -----------------------------------------------------------

    def _on_stop_signal(self, signum, frame) -> None:
        self.stop_requested = True

    def _reap(self) -> None:
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                if self.leader_status is None:
                    self.leader_status = LOST_STATUS
                return
            if pid == 0:
                return
            if pid == self.pid:
                self.leader_status = status

    def _thaw(self) -> None:
        """Let the task run: a frozen task would not act on its stop signal (nor, in a v1 cgroup, die)."""
        if self.spec.sliced:
            freezer.freezer_for(self.task_dir, self.pid).thaw()

    def _begin_stop(self, reason: str, sig: int, grace_s: float) -> None:
        now = time.monotonic()
        if self.stopping_reason is None:
            self.stopping_reason = reason
            if self.spec.sliced:
                failsafe.mark_stopping(self.task_dir)
                self._thaw()
            procs.signal_group(self.pid, sig)
        self.kill_at = min(self.kill_at or now + grace_s, now + grace_s)

    def _requested_stop(self) -> None:
        self.stop_requested = False
        request = read_json(os.path.join(self.task_dir, STOP_FILE)) or {}
        reason = _stop_reason(request.get("reason"))
        try:
            sig = signal_number(request.get("signal") or self.spec.stop_signal)
        except ValueError:
            sig = signal.SIGTERM
        grace = request.get("grace_s")
        grace = float(grace) if isinstance(grace, (int, float)) and grace >= 0 else self.spec.grace_s
        self._begin_stop(reason, sig, grace)

    def watch(self) -> None:
        """Wait for the task's main process, carrying out stop requests and the time limit meanwhile."""
        rfd, wfd = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        signal.set_wakeup_fd(wfd, warn_on_full_buffer=False)
        deadline = time.monotonic() + self.spec.time_limit_s if self.spec.time_limit_s else None
        while True:
            self._reap()
            if self.leader_status is not None:
                return
            if self.stop_requested:
                self._requested_stop()
            now = time.monotonic()
            if deadline is not None and now >= deadline and self.stopping_reason is None:
                self._begin_stop("timeout", signal_number(self.spec.stop_signal), self.spec.grace_s)
            if self.spec.sliced and (self.stopping_reason is not None or failsafe.silent(self.heartbeat)):
                self._thaw()
            if self.kill_at is not None and now >= self.kill_at:
                self._thaw()
                procs.signal_group(self.pid, signal.SIGKILL)
                procs.kill_descendants(os.getpid())
                self.kill_at = None
            waits = [SLICED_POLL_S if self.spec.sliced else 1.0]
            waits += [t - now for t in (deadline, self.kill_at) if t is not None and t > now]
            select.select([rfd], [], [], max(0.0, min(waits)))
            try:
                while os.read(rfd, 512):
                    pass
            except BlockingIOError:
                pass

    def clean_up(self) -> None:
        """Kill whatever the task left behind (its process group, orphans reparented to us) and reap it all."""
        if self.spec.sliced:
            failsafe.mark_stopping(self.task_dir)  # the slicer must not freeze what is being killed
        while True:
            self._thaw()
            procs.signal_group(self.pid, signal.SIGKILL)
            left = procs.kill_descendants(os.getpid())
            self._reap()
            if not left and not procs.group_alive(self.pid):
                freezer.remove_task_cgroup(self.task_dir)
                return
            time.sleep(CLEANUP_POLL_S)

    def finish(self) -> None:
        """Record the task's exit code or terminating signal and why it ended."""
        if self.leader_status == LOST_STATUS:
            self._record(self.state.exited(reason=self.stopping_reason or "exit status lost", ended=time.time()))
            return
        code = os.waitstatus_to_exitcode(self.leader_status or 0)
        self._record(self.state.exited(exit_code=code if code >= 0 else None,
                                       term_signal=-code if code < 0 else None,
                                       reason=self.stopping_reason or "", ended=time.time()))

    def fail(self, message: str) -> None:
        """Record that the task could not start."""
        self._record(self.state.exited(reason=f"failed to start: {message}", ended=time.time()))

    def run(self) -> int:
        """Start, watch and finish the task; returns the supervisor's exit status."""
        procs.become_subreaper()
        for signum in (signal.SIGUSR1, signal.SIGTERM, signal.SIGINT):
            signal.signal(signum, self._on_stop_signal)
        # Handlers rather than SIG_IGN: an ignored signal would stay ignored in the task after exec.
        signal.signal(signal.SIGHUP, lambda *_: None)
        signal.signal(signal.SIGCHLD, lambda *_: None)
        self._record(self.state)
        # The daemon writes the stop request before it looks for our pid, so checking after recording
        # the pid cannot miss a stop that came before the task started.
        if os.path.exists(os.path.join(self.task_dir, STOP_FILE)):
            request = read_json(os.path.join(self.task_dir, STOP_FILE)) or {}
            reason = _stop_reason(request.get("reason"))
            self._record(self.state.exited(reason=reason, ended=time.time()))
            return 0
        try:
            self.start()
        except StartError as exc:
            self.fail(str(exc))
            return 0
        except Exception as exc:  # noqa: BLE001 - anything else still has to be reported as a failed start
            self.fail(f"{type(exc).__name__}: {exc}")
            raise
        self.watch()
        self.clean_up()
        self.finish()
        return 0


def _stop_reason(requested: object) -> str:
    """The exit reason a stop request leaves: "timeout", the memory watchdog's own words, else "stopped"."""
    if requested == "timeout":
        return "timeout"
    if isinstance(requested, str) and requested.startswith("gpu memory"):
        return requested
    return "stopped"


def _supervise_forked(task_dir: str) -> None:
    """In a fork of the fork server: a session of our own, then supervise ``task_dir``; never returns."""
    code = 1
    try:
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        os.setsid()
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        log = os.open(os.path.join(task_dir, "supervisor.log"), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        os.dup2(log, 1)
        os.dup2(log, 2)
        os.close(null)
        os.close(log)
        code = Supervisor(task_dir).run()
    except BaseException:  # noqa: BLE001 - a forked child must never return into the server's loop
        import traceback
        traceback.print_exc()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


def serve_forks(stream) -> int:
    """Fork server: for each task directory read from ``stream`` (one per line), fork a detached supervisor.

    Forking this small, already-initialised process costs far less than
    starting a Python interpreter per task. Returns at end of input, which
    comes when the daemon that feeds it goes away.
    """
    # Supervisors are forked once and reaped by the kernel: with SIGCHLD
    # ignored no zombie is left, and a supervisor outlives this server.
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)
    # A forked supervisor is short-lived and makes no cycles worth collecting;
    # frozen and disabled, the collector never walks (and so never copies) the
    # pages this server shares with its children.
    gc.freeze()
    gc.disable()
    for line in stream:
        task_dir = line.decode("utf-8", "surrogateescape").rstrip("\n")
        if not task_dir:
            continue
        if os.fork() == 0:
            _supervise_forked(task_dir)
    return 0


def main(argv: list[str] | None = None) -> int:
    """Entry point: supervise the task whose directory is the one argument, or ``--fork-server``."""
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m gpud.node.supervisor TASK_DIR | --fork-server", file=sys.stderr)
        return 2
    os.umask(0o022)
    if args[0] == "--fork-server":
        return serve_forks(sys.stdin.buffer)
    return Supervisor(args[0]).run()


if __name__ == "__main__":
    sys.exit(main())
