"""Where a node keeps its tasks on disk, and the state file each task's supervisor writes."""

from __future__ import annotations

import os
import threading
from dataclasses import dataclass, replace
from typing import Any

from gpud import jsontext
from gpud.node.spec import TaskKey
from gpud.wire.task import ExitCause

STARTING, RUNNING, EXITED = "starting", "running", "exited"
ORDER_FILE, STATE_FILE, STOP_FILE = "task.json", "state.json", "stop.json"
SOCKET_NAME = "node.sock"


def write_json(path: str, data: Any, mode: int = 0o600) -> None:
    """Write ``data`` as JSON to ``path`` atomically (temporary file, then rename).

    No fsync: the file must survive the death of a process, which the page
    cache ensures; after a host crash the tasks are gone with it anyway. The
    temporary file is named after the writing process and thread, so
    writers never share one.
    """
    directory, name = os.path.split(path)
    tmp = os.path.join(directory, f".{name}.{os.getpid()}-{threading.get_ident()}.tmp")
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, mode)
        try:
            os.fchmod(fd, mode)  # exactly ``mode``, whatever the umask
            left = memoryview(jsontext.dumps(data).encode())
            while left:
                left = left[os.write(fd, left):]
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def read_json(path: str) -> Any:
    """The JSON in ``path``, or None when the file is missing or not valid JSON."""
    try:
        with open(path, "rb") as f:
            return jsontext.loads(f.read())
    except (OSError, ValueError):
        return None


@dataclass(frozen=True, slots=True)
class Layout:
    """Where a node keeps things: ``checkpoints/<job uid>/`` per job in the state directory, which outlives the
    host's reboots; ``tasks/<job>.<task>.<attempt>/`` per task and the node socket in the run directory
    (the state directory unless another is given), which need only outlive the daemon, as the tasks do.
    """

    state_dir: str
    run_dir: str | None = None

    @property
    def run_root(self) -> str:
        """The directory holding the tasks, the node socket and the slicer's heartbeat."""
        return self.run_dir or self.state_dir

    @property
    def tasks_dir(self) -> str:
        """The directory holding one directory per task the node knows."""
        return os.path.join(self.run_root, "tasks")

    @property
    def socket_path(self) -> str:
        """The datagram socket supervisors poke when their task changes state."""
        return os.path.join(self.run_root, SOCKET_NAME)

    def task_dir(self, key: TaskKey) -> str:
        """The directory of one task: its order, state, stop request and script."""
        return os.path.join(self.tasks_dir, key.dirname)

    @property
    def checkpoints_dir(self) -> str:
        """The directory holding one checkpoint directory per job uid."""
        return os.path.join(self.state_dir, "checkpoints")

    def checkpoint_dir(self, job_uid: str) -> str:
        """The job's checkpoint directory, kept across requeues of the job: named by its uid, never its id,
        so a job of another cluster, or of a store made anew or restored, never finds another job's files."""
        return os.path.join(self.checkpoints_dir, job_uid)

    def create(self) -> None:
        """Make the state and run directories and their sub-directories, with the modes docs/admin-guide.md explains.

        The tasks directory (orders, environments, scripts) is root's alone
        (0700). Jobs' users may only traverse (0711, never list) what leads to
        their checkpoint directory (state dir, ``checkpoints``) and to the
        interactive exit files (run dir); existing directories get these modes too.
        """
        for path, mode in ((self.state_dir, 0o711), (self.run_root, 0o711), (self.tasks_dir, 0o700),
                           (self.checkpoints_dir, 0o711)):
            os.makedirs(path, mode=mode, exist_ok=True)
            os.chmod(path, mode)


@dataclass(frozen=True, slots=True)
class TaskState:
    """What the node knows of a task's processes: written by the daemon at launch, then by the supervisor."""

    key: TaskKey
    state: str = STARTING
    supervisor_pid: int | None = None
    supervisor_start: int | None = None
    pid: int | None = None
    pid_start: int | None = None
    exit_code: int | None = None
    term_signal: int | None = None
    reason: str = ""  # the cause in words, for people
    started: float | None = None
    ended: float | None = None
    max_rss_bytes: int | None = None  # peak memory of the task's cgroup, when it had one
    cpu_s: float | None = None  # CPU time of every process in the task's cgroup
    cause: ExitCause | None = None  # why an exited task ended

    def to_json(self) -> dict:
        """The state as written to the task's state file."""
        return {**self.key.to_json(), "state": self.state, "supervisor_pid": self.supervisor_pid,
                "supervisor_start": self.supervisor_start, "pid": self.pid, "pid_start": self.pid_start,
                "exit_code": self.exit_code,
                "term_signal": self.term_signal, "reason": self.reason, "started": self.started,
                "ended": self.ended, "max_rss_bytes": self.max_rss_bytes, "cpu_s": self.cpu_s,
                "cause": self.cause.value if self.cause is not None else None}

    @classmethod
    def from_json(cls, data: Any) -> TaskState | None:
        """A state read back from its file; None when the data is not a task state."""
        if not isinstance(data, dict):
            return None
        try:
            key = TaskKey(str(data["job"]), int(data["task"]), int(data["attempt"]), str(data.get("job_uid") or ""))
            if data["state"] not in (STARTING, RUNNING, EXITED):
                return None
            return cls(key, data["state"], data.get("supervisor_pid"), data.get("supervisor_start"),
                       data.get("pid"), data.get("pid_start"), data.get("exit_code"), data.get("term_signal"),
                       str(data.get("reason") or ""), data.get("started"), data.get("ended"),
                       data.get("max_rss_bytes"), data.get("cpu_s"), _cause(data.get("cause"), data["state"]))
        except (KeyError, TypeError, ValueError):
            return None

    def exited(self, *, exit_code: int | None = None, term_signal: int | None = None, reason: str = "",
               cause: ExitCause = ExitCause.EXITED, ended: float) -> TaskState:
        """This task, finished: why as ``cause``, and in words for people as ``reason``."""
        return replace(self, state=EXITED, exit_code=exit_code, term_signal=term_signal, reason=reason,
                       cause=cause, ended=ended)

    def report(self) -> dict:
        """The task report of the node protocol (a starting task reports as running)."""
        report = {**self.key.to_json(), "state": EXITED if self.state == EXITED else RUNNING, "pid": self.pid,
                  "exit_code": self.exit_code, "term_signal": self.term_signal, "reason": self.reason,
                  "started": self.started, "ended": self.ended}
        if self.state == EXITED:
            report["cause"] = (self.cause or ExitCause.EXITED).value
        if self.max_rss_bytes is not None:
            report["max_rss_bytes"] = self.max_rss_bytes
        if self.cpu_s is not None:
            report["cpu_s"] = round(self.cpu_s, 3)
        return report


def _cause(value: Any, state: str) -> ExitCause | None:
    """The exit cause a state file records; an exited task's file without one (written before causes were
    kept) says its processes exited."""
    if value in ExitCause.__members__.values():
        return ExitCause(value)
    return ExitCause.EXITED if state == EXITED else None


def write_state(task_dir: str, state: TaskState) -> None:
    """Record a task's state in its directory, atomically; readable by anyone on the host."""
    write_json(os.path.join(task_dir, STATE_FILE), state.to_json(), mode=0o644)


def read_state(task_dir: str) -> TaskState | None:
    """The state recorded in a task directory, or None when there is none (yet)."""
    return TaskState.from_json(read_json(os.path.join(task_dir, STATE_FILE)))
