"""Starting a task's supervisor, detached from the daemon, and asking it to stop the task."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time

import gpud
from gpud.node import procs
from gpud.node.spec import TaskKey, TaskSpec
from gpud.node.taskstate import (ORDER_FILE, STOP_FILE, Layout, TaskState, read_state, write_json,
                                 write_state)

_SOURCE_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(gpud.__file__)))


class Launcher:
    """Starts supervisors (``python -m gpud.node.supervisor TASK_DIR``) in their own sessions.

    A supervisor outlives the daemon that started it; while the daemon lives
    it reaps the supervisors it started, so none stays a zombie.
    """

    def __init__(self, layout: Layout, python: str = sys.executable) -> None:
        self.layout = layout
        self.python = python
        self._children: dict[TaskKey, subprocess.Popen] = {}

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
        env = {"PATH": os.environ.get("PATH", ""), "PYTHONPATH": _SOURCE_ROOT, "LANG": "C.UTF-8"}
        with open(os.path.join(task_dir, "supervisor.log"), "ab") as log:
            child = subprocess.Popen([self.python, "-m", "gpud.node.supervisor", task_dir], cwd="/", env=env,
                                     stdin=subprocess.DEVNULL, stdout=log, stderr=log, start_new_session=True,
                                     close_fds=True)
        self._children[key] = child
        return state

    def supervisor_alive(self, state: TaskState) -> bool:
        """True while the supervisor of the task is running (checked by pid and start time)."""
        child = self._children.get(state.key)
        if child is not None and child.poll() is None:
            return True
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

    def forget(self, key: TaskKey) -> None:
        """Delete a finished task's directory (its output files in the workdir stay)."""
        self._children.pop(key, None)
        shutil.rmtree(self.layout.task_dir(key), ignore_errors=True)
