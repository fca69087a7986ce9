"""Starting a task's supervisor, detached from the daemon, and asking it to stop the task."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import gpud
from gpud.node import procs
from gpud.node.freezer import FREEZER_ENV
from gpud.node.spec import TaskKey, TaskSpec
from gpud.node.taskstate import (ORDER_FILE, STOP_FILE, Layout, TaskState, read_state, write_json,
                                 write_state)

_SOURCE_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(gpud.__file__)))
FORK_START_S = 30.0  # how long a forked supervisor may take to record its pid before it is deemed lost


def _supervisor_env() -> dict[str, str]:
    env = {"PATH": os.environ.get("PATH", ""), "PYTHONPATH": _SOURCE_ROOT, "LANG": "C.UTF-8"}
    if FREEZER_ENV in os.environ:
        env[FREEZER_ENV] = os.environ[FREEZER_ENV]
    return env


class Launcher:
    """Starts supervisors (``python -m gpud.node.supervisor TASK_DIR``) in their own sessions.

    A supervisor outlives the daemon that started it; while the daemon lives
    it reaps the supervisors it started, so none stays a zombie.
    """

    def __init__(self, layout: Layout, python: str = sys.executable, *, fork_server: bool = True) -> None:
        self.layout = layout
        self._deleter = ThreadPoolExecutor(1, thread_name_prefix="gpud-task-cleanup")
        self.python = python
        self.fork_server = fork_server
        self._children: dict[TaskKey, subprocess.Popen] = {}
        self._forked: dict[TaskKey, float] = {}
        self._server: subprocess.Popen | None = None

    def launch(self, key: TaskKey, spec: TaskSpec) -> TaskState:
        """Write the task's order and first state into a fresh task directory and start its supervisor.

        Returns the task's state as the daemon knows it right after the start;
        the supervisor then records running (with the task's pid) or exited.
        """
        task_dir = self.layout.task_dir(key)
        shutil.rmtree(task_dir, ignore_errors=True)
        os.makedirs(task_dir, mode=0o711)
        os.chmod(task_dir, 0o711)
        order = {"key": key.to_json(), "spec": spec.to_json(),
                 "checkpoint_dir": self.layout.checkpoint_dir(key.job), "notify": self.layout.socket_path}
        write_json(os.path.join(task_dir, ORDER_FILE), order)
        state = TaskState(key, started=time.time())
        write_state(task_dir, state)
        if not self._fork(key, task_dir):
            with open(os.path.join(task_dir, "supervisor.log"), "ab") as log:
                self._children[key] = subprocess.Popen(
                    [self.python, "-m", "gpud.node.supervisor", task_dir], cwd="/", env=_supervisor_env(),
                    stdin=subprocess.DEVNULL, stdout=log, stderr=log, start_new_session=True, close_fds=True)
        return state

    def _fork(self, key: TaskKey, task_dir: str) -> bool:
        """Have the fork server start the supervisor; False when there is no working fork server."""
        if not self.fork_server:
            return False
        server = self._server
        if server is None or server.poll() is not None:
            server = self._server = subprocess.Popen(
                [self.python, "-m", "gpud.node.supervisor", "--fork-server"], cwd="/", env=_supervisor_env(),
                stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, close_fds=True)
        try:
            server.stdin.write(task_dir.encode("utf-8", "surrogateescape") + b"\n")
            server.stdin.flush()
        except OSError:
            self.close()
            return False
        self._forked[key] = time.monotonic()
        return True

    def close(self) -> None:
        """Stop the fork server (supervisors it started keep running)."""
        server, self._server = self._server, None
        if server is not None:
            try:
                server.stdin.close()
            except OSError:
                pass
            try:
                server.wait(timeout=5)
            except subprocess.TimeoutExpired:
                server.kill()
                server.wait()

    def supervisor_alive(self, state: TaskState) -> bool:
        """True while the supervisor of the task is running (checked by pid and start time)."""
        child = self._children.get(state.key)
        if child is not None and child.poll() is None:
            return True
        if state.supervisor_pid is None:
            forked = self._forked.get(state.key)
            return forked is not None and time.monotonic() - forked < FORK_START_S
        return procs.same_process(state.supervisor_pid, state.supervisor_start)

    def request_stop(self, state: TaskState, reason: str, grace_s: float | None,
                     stop_signal: str | None = None) -> bool:
        """Ask the task's supervisor to stop the task; False when no supervisor is alive to do it."""
        task_dir = self.layout.task_dir(state.key)
        write_json(os.path.join(task_dir, STOP_FILE),
                   {"reason": reason, "grace_s": grace_s, "signal": stop_signal}, mode=0o644)
        current = read_state(task_dir) or state
        pid = current.supervisor_pid
        if pid is None:
            # Not yet initialised: the supervisor reads the stop file before it starts the task.
            return self.supervisor_alive(current)
        if not self.supervisor_alive(current):
            return False
        try:
            os.kill(pid, signal.SIGUSR1)
        except ProcessLookupError:
            return False
        return True

    def reap(self) -> None:
        """Collect the exit status of finished supervisors this daemon started."""
        for key, child in list(self._children.items()):
            if child.poll() is not None:
                del self._children[key]
        if self._server is not None:
            self._server.poll()

    def forget(self, key: TaskKey) -> None:
        """Delete a finished task's directory (its output files in the workdir stay)."""
        self._children.pop(key, None)
        self._forked.pop(key, None)
        # Off the event loop: deleting a directory costs more than the rest of an exit report.
        self._deleter.submit(shutil.rmtree, self.layout.task_dir(key), ignore_errors=True)
