"""The node's table of tasks: started, adopted from disk after a restart, stopped, acknowledged."""

from __future__ import annotations

import logging
import os
import pwd
import signal
import time
from typing import Any, Mapping

from gpud.node import cgroups, cgspares, failsafe, procs
from gpud.node.freezer import freezer_for, remove_task_cgroup
from gpud.node.launch import Launcher
from gpud.node.spec import SpecError, TaskKey, TaskSpec, expand_path, is_job_uid
from gpud.wire.task import ExitCause
from gpud.node.taskstate import EXITED, ORDER_FILE, Layout, TaskState, read_json, read_state, write_state

log = logging.getLogger(__name__)
MAX_LOG_CHUNK = 1024 * 1024
FORGOTTEN_KEPT = 4096


class TaskTable:
    """Every task this node runs, plus exited ones the controller has not acknowledged yet."""

    def __init__(self, layout: Layout, launcher: Launcher | None = None) -> None:
        self.layout = layout
        self.launcher = launcher or Launcher(layout)
        self._states: dict[TaskKey, TaskState] = {}
        self._reported: dict[TaskKey, dict] = {}
        self._forgotten: dict[TaskKey, None] = {}  # acknowledged lately: never adopted again
        self.specs: dict[TaskKey, TaskSpec] = {}  # the specs of the tasks this table started, until acknowledged
        self._purges: dict[str, str] = {}  # job uid -> job id: checkpoint directories to delete once its tasks exit

    def adopt(self) -> list[TaskState]:
        """Load the tasks recorded in the state directory (after a daemon restart) and return them."""
        self.layout.create()
        for name in sorted(os.listdir(self.layout.tasks_dir)):
            key = TaskKey.from_dirname(name)
            state = read_state(os.path.join(self.layout.tasks_dir, name)) if key else None
            if key is None or state is None or state.key != key:
                continue
            self._states[key] = state
        for key in list(self._states):
            state = self._states[key] = self._check(self._states[key])
            if state.state == EXITED and not self.launcher.supervisor_alive(state):
                _remove_left_cgroups(self.layout.task_dir(key))
        cgspares.remove_stale(self.layout.tasks_dir)  # those of a supervisor that died with the node
        return sorted(self._states.values(), key=lambda s: s.key)

    def resolve(self, key: TaskKey) -> TaskKey:
        """The key of the known task an order names: itself, or, where one side has no job uid (an older
        controller, or a task started by one), the task with the same job id, task and attempt."""
        if key in self._states:
            return key
        for known in self._states:
            if known.same_task(key) and (not key.uid or not known.uid):
                return known
        return key

    def get(self, key: TaskKey) -> TaskState | None:
        """The task's latest known state, or None when the node does not know it."""
        return self._states.get(key)

    def states(self) -> list[TaskState]:
        """Every known task, in key order."""
        return sorted(self._states.values(), key=lambda s: s.key)

    def reports(self) -> list[dict]:
        """The task list of a register or heartbeat message."""
        return [state.report() for state in self.states()]

    def start(self, key: TaskKey, spec: TaskSpec) -> TaskState | None:
        """Start a task; None when the node already has it (the order is then ignored)."""
        if key in self._states:
            return None
        try:
            state = self.launcher.launch(key, spec)
        except OSError as exc:
            return self._failed(key, f"cannot launch the supervisor: {exc}")
        self._states[key] = state
        self.specs[key] = spec
        return state

    def refuse(self, key: TaskKey, message: str) -> TaskState | None:
        """Record a task whose start order cannot be run as failed to start (``message`` says why), so the
        controller hears of it in the next report; None when the node already has the task."""
        if key in self._states:
            return None
        return self._failed(key, message)

    def _failed(self, key: TaskKey, message: str) -> TaskState:
        state = TaskState(key).exited(reason=f"failed to start: {message}", cause=ExitCause.FAILED_TO_START,
                                      ended=time.time())
        task_dir = self.layout.task_dir(key)
        os.makedirs(task_dir, mode=0o700, exist_ok=True)
        write_state(task_dir, state)
        self._states[key] = state
        return state

    def stop(self, key: TaskKey, reason: str, grace_s: float | None = None, stop_signal: str | None = None,
             leader_only: bool = False, *, hasten: bool = False, cause: ExitCause = ExitCause.STOPPED) -> bool:
        """Stop a task (its stop signal, or ``stop_signal``, to its first process alone with ``leader_only``;
        then SIGKILL after ``grace_s``, which may end an earlier stop's grace sooner only with ``hasten``);
        its exit will have ``cause`` and ``reason``. False when it is unknown or has exited."""
        state = self._states.get(key)
        if state is None or state.state == EXITED:
            return False
        if not self.launcher.request_stop(state, reason, grace_s, stop_signal, leader_only, hasten=hasten,
                                          cause=cause):
            # No supervisor to do it: the processes get SIGKILL at once, and _check records the exit.
            self._states[key] = self._check(state)
        return True

    def ack(self, key: TaskKey) -> bool:
        """Forget an exited task the controller has recorded; False when it is unknown or still running."""
        state = self._states.get(key)
        if state is None or state.state != EXITED:
            return False
        del self._states[key]
        self._reported.pop(key, None)
        self.specs.pop(key, None)
        self._forgotten[key] = None
        if len(self._forgotten) > FORGOTTEN_KEPT:
            del self._forgotten[next(iter(self._forgotten))]
        self.launcher.forget(key)
        return True

    def purge(self, order: Mapping[str, Any]) -> bool:
        """Delete the checkpoint directory of a job that has ended for good, once none of its tasks runs here.

        False (and nothing deleted) when the order names no job uid.
        """
        uid, job = order.get("job_uid"), order.get("job")
        if not is_job_uid(uid):
            return False
        job = job if isinstance(job, str) else ""
        self._purges[uid] = job
        self._run_purges()
        return True

    def checkpoints(self) -> list[str]:
        """The job uids of the checkpoint directories on this node (the controller says which jobs are gone)."""
        try:
            names = os.listdir(self.layout.checkpoints_dir)
        except OSError:
            return []
        return sorted(name for name in names if is_job_uid(name) and name not in self._purges)

    def _run_purges(self) -> None:
        if not self._purges:
            return
        live = {key.uid or key.job for key, state in self._states.items() if state.state != EXITED}
        for uid, job in list(self._purges.items()):
            if uid not in live and (not job or job not in live):
                del self._purges[uid]
                self.launcher.delete(self.layout.checkpoint_dir(uid))

    def refresh(self, keys: list[TaskKey] | None = None) -> list[TaskState]:
        """Re-read the state of unfinished tasks (all, or ``keys``); returns those (of them) whose report changed.

        A key this table does not know is adopted when its task directory
        has a state: a supervisor fed by an earlier daemon recorded the task
        after this table's :meth:`adopt` looked.
        """
        self.launcher.reap()
        for key in keys if keys is not None else list(self._states):
            state = self._states.get(key)
            if state is None and key not in self._forgotten:
                found = read_state(self.layout.task_dir(key))
                state = found if found is not None and found.key == key else None
                if state is not None:
                    self._states[key] = self._check(state)
            elif state is not None and state.state != EXITED:
                self._states[key] = self._check(state)
        self._run_purges()
        changed = []
        for key in keys if keys is not None else list(self._states):
            state = self._states.get(key)
            if state is not None and self._reported.get(key) != state.report():
                changed.append(state)
        return sorted(changed, key=lambda s: s.key)

    def mark_reported(self, states: list[TaskState]) -> None:
        """Remember that these states were sent, so refresh reports only later changes."""
        for state in states:
            self._reported[state.key] = state.report()

    def _check(self, known: TaskState) -> TaskState:
        task_dir = self.layout.task_dir(known.key)
        state = read_state(task_dir) or known
        if state.state == EXITED or self.launcher.supervisor_alive(state):
            return state
        # The supervisor may have recorded the exit just before it ended: read again before deciding it is lost.
        state = read_state(task_dir) or state
        if state.state == EXITED:
            return state
        group = cgroups.recorded(task_dir)
        if group is not None and group.pids():
            # Its cgroups hold whatever it started, however it left the process group: none may run unattended.
            log.warning("task %s lost its supervisor; killing every process in its cgroups", known.key.dirname)
            if state.pid:
                _thaw_for_good(task_dir, state.pid)
            group.kill()
            return state
        if state.pid and procs.group_is_ours(state.pid, state.pid_start):
            log.warning("task %s lost its supervisor; killing its processes", known.key.dirname)
            _thaw_for_good(task_dir, state.pid)  # a task frozen in a cgroup dies only once thawed
            procs.signal_group(state.pid, signal.SIGKILL)
            return state
        if group is not None:
            group.remove()
        remove_task_cgroup(task_dir)  # its supervisor would have, had it lived
        cgspares.remove_stale(self.layout.tasks_dir)  # and its spare cgroups, when it exited
        if state.pid:
            lost = state.exited(reason="supervisor lost", cause=ExitCause.SUPERVISOR_LOST, ended=time.time())
        else:
            lost = state.exited(reason="failed to start: the supervisor did not start", cause=ExitCause.NO_SUPERVISOR,
                                ended=time.time())
        # A node-wide supervisor that died before it took the order never made the task's directory.
        os.makedirs(task_dir, mode=0o711, exist_ok=True)
        write_state(task_dir, lost)
        return lost

    def read_log(self, request: Mapping[str, Any]) -> dict:
        """Answer a ``read_log`` order with up to ``limit`` bytes of a task's output from ``offset``.

        ``path`` is the file to read; without it, the task's output file.
        The answer's ``offset`` is where the next read should start.
        """
        answer = {"type": "log", "request": request.get("request"), "data": "", "missing": True}
        offset = request.get("offset") or 0
        limit = request.get("limit") or 65536
        if not isinstance(offset, int) or not isinstance(limit, int) or offset < 0 or limit <= 0:
            return {**answer, "offset": 0, "error": "offset and limit must be non-negative integers"}
        path = request.get("path") or self._output_path(request)
        answer["offset"] = offset
        if not isinstance(path, str) or not os.path.isabs(path):
            return answer
        owner = self._log_owner(request)
        try:
            with open(path, "rb") as f:
                if owner is None or not owned_by(os.fstat(f.fileno()).st_uid, owner):
                    return {**answer, "missing": False, "error": "the file is not the job user's own: not shown"}
                f.seek(offset)
                data = f.read(min(limit, MAX_LOG_CHUNK))
        except OSError:
            return answer
        cut = _complete_utf8(data)
        return {**answer, "data": data[:cut].decode("utf-8", errors="replace"), "offset": offset + cut,
                "missing": False}

    def _log_owner(self, request: Mapping[str, Any]) -> int | None:
        # The daemon reads as root: a log is shown only when the job's user
        # owns the file, so a job cannot name /etc/shadow as its output.
        if os.geteuid() != 0:
            return os.geteuid()
        user = request.get("user")
        if not isinstance(user, str):
            order = self._order(request)
            user = ((order or {}).get("spec") or {}).get("user")
        try:
            return pwd.getpwnam(user).pw_uid if isinstance(user, str) else None
        except KeyError:
            return None

    def _order(self, request: Mapping[str, Any]) -> dict | None:
        try:
            key = TaskKey.from_order(request)
        except SpecError:
            return None
        order = read_json(os.path.join(self.layout.task_dir(key), ORDER_FILE))
        return order if isinstance(order, dict) else None

    def _output_path(self, request: Mapping[str, Any]) -> str | None:
        try:
            key = TaskKey.from_order(request)
        except SpecError:
            return None
        order = read_json(os.path.join(self.layout.task_dir(key), ORDER_FILE))
        if not isinstance(order, dict):
            return None
        spec = order.get("spec") or {}
        stream = spec.get("error") if request.get("stream") == "err" and spec.get("error") else spec.get("output")
        return expand_path(stream or "gpud-%j.out", spec.get("workdir", "/"), key)


def owned_by(file_uid: int, user_uid: int) -> bool:
    """True when a file owned by ``file_uid`` may be shown to the user ``user_uid`` (root sees everything)."""
    return user_uid == 0 or file_uid == user_uid


def _complete_utf8(data: bytes) -> int:
    """How many leading bytes of ``data`` to send so no multi-byte character is cut (its rest comes next read)."""
    for back in range(1, min(4, len(data)) + 1):
        byte = data[-back]
        if byte & 0xC0 == 0x80:
            continue
        if byte >= 0xC0:
            need = 2 if byte < 0xE0 else 3 if byte < 0xF0 else 4
            if need > back and back < len(data):
                return len(data) - back
        return len(data)
    return len(data)


def _thaw_for_good(task_dir: str, pid: int) -> None:
    """Thaw a task about to be killed, and mark it stopping so that no slicer freezes it again before it dies."""
    failsafe.mark_stopping(task_dir)
    freezer_for(task_dir, pid).thaw()


def _remove_left_cgroups(task_dir: str) -> None:
    """Remove the cgroups an exited task still has under its name: its supervisor died before it removed
    them, or while it kept them as spares, renaming them one hierarchy at a time."""
    group = cgroups.recorded(task_dir)
    if group is not None:
        group.kill()  # an exited task's groups are empty; whatever is there must not run unwatched
        group.remove()
