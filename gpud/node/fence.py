"""The node's lease fence: ``python -m gpud.node.fence RUN_DIR [DAEMON_PID]``, which stops the node's tasks once its
lease runs out.

The supervisor already stops its tasks when the lease runs out, but a
supervisor killed together with the daemon (an OOM kill of both, a unit
stopped with KillMode=process and a kill -9) leaves nothing to do it: the
controller requeues the job after the lease, its grace period and a margin,
and two copies would run. The fence is a process of its own, in a session
of its own, started by the daemon whenever it holds a lease and none runs
(an exclusive lock on ``fence.lock`` in the run directory says one does);
it lives on when the daemon and the supervisor die, and ends once no task
of the node runs and either no lease is held or the daemon that started
it is gone.

Every :data:`CHECK_S` it reads the lease file and the task directories.
Once the lease has run out, each task still running is stopped:

- its supervisor alive, the supervisor stops it (the stop signal, then
  SIGKILL after the grace period); the fence kills what is left just after
  that grace period, should the supervisor hang;
- its supervisor dead, the fence thaws it (a frozen task would not act on
  its signal), sends the stop signal to its process group and cgroups, and
  kills everything in them after the job's grace period (at most the
  lease's), then records the exit and removes the task's cgroups.

Either way nothing of the task runs past the lease's end plus the grace
period, before the controller may start the job elsewhere. The fence also
thaws a time-sliced task whose supervisor and slicer are both gone, as the
supervisor would.
"""

from __future__ import annotations

import fcntl
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass

from gpud.node import cgroups, cgspares, failsafe, freezer, lease, procs
from gpud.node.spec import signal_number
from gpud.wire.task import ExitCause
from gpud.node.taskstate import EXITED, ORDER_FILE, TaskState, read_json, read_state, write_state

LOCK_FILE = "fence.lock"
LOG_FILE = "fence.log"
CHECK_S = 0.25  # how often the fence looks at the lease and the tasks
# A supervisor stops its task at most a check after the lease ran out: the fence's SIGKILL comes later still.
SUPERVISED_SLACK_S = 2 * lease.CHECK_S
LOCK_TRIES = 20  # a fence that finds the lock held tries again for a second (the daemon may be probing it)


@dataclass(slots=True)
class Fenced:
    """A task the fence is stopping: when everything left of it gets SIGKILL."""

    kill_at: float
    signalled: bool


def lock_path(run_root: str) -> str:
    """The lock file the running fence of the node in ``run_root`` holds."""
    return os.path.join(run_root, LOCK_FILE)


def running(run_root: str) -> bool:
    """True while a fence holds the node's lock."""
    try:
        fd = os.open(lock_path(run_root), os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)  # releases the probe's lock at once
    return False


def fence_pid(run_root: str) -> int | None:
    """The pid of the node's running fence, as it recorded it; None when none runs."""
    if not running(run_root):
        return None
    try:
        with open(lock_path(run_root), encoding="ascii") as f:
            return int(f.read().strip() or 0) or None
    except (OSError, ValueError):
        return None


def ensure(run_root: str, env: dict[str, str], python: str = sys.executable) -> subprocess.Popen | None:
    """Start the node's fence for this daemon unless one runs; returns the process started (None: one ran already).

    The caller reaps it (it is the caller's child); the fence outlives the caller while the node has tasks.
    """
    if running(run_root):
        return None
    with open(os.path.join(run_root, LOG_FILE), "ab") as log:
        return subprocess.Popen([python, "-m", "gpud.node.fence", run_root, str(os.getpid())], cwd="/", env=env,
                                stdin=subprocess.DEVNULL, stdout=log, stderr=log, start_new_session=True,
                                close_fds=True)


class Fence:
    """Watches one node's lease and tasks; :meth:`step` does one pass."""

    def __init__(self, run_root: str, daemon: int | None = None) -> None:
        self.run_root = run_root
        self.daemon = (daemon, procs.start_ticks(daemon)) if daemon else None
        self.tasks_dir = os.path.join(run_root, "tasks")
        self.lease_file = lease.lease_path(run_root)
        self.heartbeat = failsafe.heartbeat_path(run_root)
        self.fenced: dict[str, Fenced] = {}
        self._orders: dict[str, tuple[int, float, bool]] = {}  # task dir -> stop signal, grace, time-sliced

    def _order(self, task_dir: str) -> tuple[int, float, bool]:
        found = self._orders.get(task_dir)
        if found is None:
            spec = (read_json(os.path.join(task_dir, ORDER_FILE)) or {}).get("spec") or {}
            try:
                sig = signal_number(spec.get("stop_signal") or "TERM")
            except ValueError:
                sig = signal.SIGTERM
            grace = spec.get("grace_s")
            slicing = spec.get("time_slicing") or {}
            found = (sig, float(grace) if isinstance(grace, (int, float)) and grace >= 0 else 30.0,
                     isinstance(slicing, dict) and slicing.get("mode") in ("strict", "fair"))
            self._orders[task_dir] = found
        return found

    def step(self, now: float) -> bool:
        """Look at the lease and every task once, stopping what must stop; False once the fence may end."""
        held = lease.read_lease(self.lease_file)
        expired = held is not None and held.expired(now)
        daemon_alive = self.daemon is not None and procs.same_process(*self.daemon)
        if daemon_alive and held is not None and not expired and not self.fenced:
            return True  # a live daemon renews the lease (and reaps the tasks of a lost supervisor): nothing to do
        live = 0
        try:
            names = os.listdir(self.tasks_dir)
        except OSError:
            names = []
        for name in names:
            task_dir = os.path.join(self.tasks_dir, name)
            state = read_state(task_dir)
            if state is None or state.state == EXITED:
                self.fenced.pop(task_dir, None)
                self._orders.pop(task_dir, None)
                continue
            supervised = procs.same_process(state.supervisor_pid, state.supervisor_start)
            group = cgroups.recorded(task_dir, supervisor=state.supervisor_pid if supervised else None)
            members = group.pids() if group is not None else []
            leader = procs.group_is_ours(state.pid, state.pid_start) if state.pid else False
            if not members and not leader:
                if not supervised and state.pid:
                    self._record_end(task_dir, state, group)
                elif supervised:
                    live += 1  # about to start, or its supervisor is recording its end
                continue
            live += 1
            if not supervised and failsafe.silent(self.heartbeat):
                self._thaw(task_dir, state, for_good=False)  # no slicer and no supervisor: never left frozen
            if expired and held is not None:
                self._stop(task_dir, state, group, supervised, held, now)
        if live:
            return True
        return held is not None and not expired and (daemon_alive or self.daemon is None)

    def _stop(self, task_dir: str, state: TaskState, group: cgroups.TaskCgroup | None, supervised: bool,
              held: lease.Lease, now: float) -> None:
        sig, grace, _ = self._order(task_dir)
        grace = max(0.0, min(grace, held.grace_s))
        fenced = self.fenced.get(task_dir)
        if fenced is None:
            fenced = self.fenced[task_dir] = Fenced(held.expires + grace + SUPERVISED_SLACK_S, False)
            print(f"gpud fence: the node's lease ran out; {'making sure task' if supervised else 'stopping task'} "
                  f"{os.path.basename(task_dir)} {'stops' if supervised else ''}".rstrip(), file=sys.stderr,
                  flush=True)
        if not supervised and not fenced.signalled:
            # No supervisor to stop it (it died with the daemon, or meanwhile): the fence does, with the job's grace.
            fenced.signalled = True
            self._thaw(task_dir, state)
            if state.pid:
                procs.signal_group(state.pid, sig)
            if group is not None:
                group.signal(sig, besides_group=state.pid or None)
            fenced.kill_at = min(fenced.kill_at, now + grace)
        if now >= fenced.kill_at:
            self._thaw(task_dir, state)
            if state.pid and procs.group_is_ours(state.pid, state.pid_start):
                procs.signal_group(state.pid, signal.SIGKILL)
            if group is not None:
                group.kill()

    def _thaw(self, task_dir: str, state: TaskState, *, for_good: bool = True) -> None:
        """Thaw a time-sliced task (``for_good``: and mark it stopping, so no slicer freezes it again)."""
        if not self._order(task_dir)[2] or not state.pid:
            return
        if for_good:
            failsafe.mark_stopping(task_dir)
        freezer.freezer_for(task_dir, state.pid).thaw()

    def _record_end(self, task_dir: str, state: TaskState, group: cgroups.TaskCgroup | None) -> None:
        """A task whose supervisor is gone has ended: record it, as its supervisor would have, and remove its
        cgroups. Only a task the fence stopped is recorded; a restarted daemon finds the others."""
        if task_dir not in self.fenced:
            return
        if group is not None:
            group.remove()
        freezer.remove_task_cgroup(task_dir)
        cgspares.remove_stale(os.path.dirname(task_dir))  # the spare cgroups its supervisor left
        write_state(task_dir, state.exited(reason=lease.FENCED_REASON, cause=ExitCause.FENCED, ended=time.time()))
        print(f"gpud fence: task {os.path.basename(task_dir)} stopped", file=sys.stderr, flush=True)
        del self.fenced[task_dir]

    def run(self) -> int:
        """Watch until no task runs and no lease is held; returns the exit status."""
        while self.step(time.monotonic()):
            time.sleep(CHECK_S)
        return 0


def _take_lock(run_root: str) -> int | None:
    fd = os.open(lock_path(run_root), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    for attempt in range(LOCK_TRIES):
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            time.sleep(0.05)
            continue
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        return fd
    os.close(fd)
    return None


def main(argv: list[str] | None = None) -> int:
    """Entry point: ``python -m gpud.node.fence RUN_DIR [DAEMON_PID]``; exits at once when the node has a fence
    already. Without tasks, it ends once the daemon DAEMON_PID is gone (or the lease ran out)."""
    args = sys.argv[1:] if argv is None else argv
    if not 1 <= len(args) <= 2 or args[0].startswith("-") or not all(a.isdigit() for a in args[1:]):
        print("usage: python -m gpud.node.fence RUN_DIR [DAEMON_PID]", file=sys.stderr)
        return 2
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    lock = _take_lock(args[0])
    if lock is None:
        return 0  # another fence watches this node
    return Fence(args[0], int(args[1]) if len(args) == 2 else None).run()


if __name__ == "__main__":
    sys.exit(main())
