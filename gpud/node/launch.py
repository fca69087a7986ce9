"""Handing a task to a supervisor, detached from the daemon, and asking it to stop the task."""

from __future__ import annotations

import fcntl
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import gpud
from gpud import jsontext
from gpud.node import cgspares, procs
from gpud.node.cgroups import CGROUPS_ENV
from gpud.node.freezer import FREEZER_ENV
from gpud.node.spec import TaskKey, TaskSpec
from gpud.wire.task import ExitCause
from gpud.node.taskstate import (ORDER_FILE, STOP_FILE, Layout, TaskState, read_state, write_json,
                                 write_state)

PIPE_BYTES = 1 << 20
_SOURCE_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(gpud.__file__)))


def child_env() -> dict[str, str]:
    """The environment of the processes the daemon starts to outlive it: supervisors and the fence."""
    # The daemon's own import path comes along: the supervisor imports what the daemon does.
    path = os.pathsep.join(p for p in (_SOURCE_ROOT, os.environ.get("PYTHONPATH", "")) if p)
    env = {"PATH": os.environ.get("PATH", ""), "PYTHONPATH": path, "LANG": "C.UTF-8"}
    for name in (FREEZER_ENV, CGROUPS_ENV):
        if name in os.environ:
            env[name] = os.environ[name]
    return env


class Launcher:
    """Hands tasks to a supervisor (``python -m gpud.node.supervisor``) running in a session of its own.

    One supervisor, fed start orders through a pipe, serves every task this
    launcher starts (``node_wide``); otherwise each task gets a supervisor
    process of its own. A supervisor outlives the daemon that started it;
    while the daemon lives it reaps the supervisors it started, so none stays
    a zombie.
    """

    def __init__(self, layout: Layout, python: str = sys.executable, *, node_wide: bool = True) -> None:
        self.layout = layout
        self._deleter = ThreadPoolExecutor(1, thread_name_prefix="gpud-task-cleanup")
        self._doomed: list[str] = []
        self._doomed_lock = threading.Lock()
        self.python = python
        self.node_wide = node_wide
        self._children: dict[TaskKey, subprocess.Popen] = {}
        self._handed: dict[TaskKey, subprocess.Popen] = {}
        self._server: subprocess.Popen | None = None
        self._swept: subprocess.Popen | None = None  # the exited node-wide supervisor whose spares were looked at

    def launch(self, key: TaskKey, spec: TaskSpec) -> TaskState:
        """Hand the task to a supervisor, which writes its directory and starts it.

        Returns the task's state as the daemon knows it right after the
        hand-over; the supervisor then records running (with the task's pid)
        or exited.
        """
        task_dir = self.layout.task_dir(key)
        order = {"key": key.to_json(), "spec": spec.to_json(),
                 "checkpoint_dir": self.layout.checkpoint_dir(spec.job_uid or key.job), "notify": self.layout.socket_path}
        try:
            os.unlink(os.path.join(task_dir, STOP_FILE))  # left by an earlier task of the same name
        except FileNotFoundError:
            pass
        if not self._hand_over(key, task_dir, order):
            shutil.rmtree(task_dir, ignore_errors=True)
            os.makedirs(task_dir, mode=0o700)
            os.chmod(task_dir, 0o700)
            write_json(os.path.join(task_dir, ORDER_FILE), order)
            write_state(task_dir, TaskState(key, started=time.time()))
            with open(os.path.join(task_dir, "supervisor.log"), "ab") as log:
                self._children[key] = subprocess.Popen(
                    [self.python, "-m", "gpud.node.supervisor", task_dir], cwd="/", env=child_env(),
                    stdin=subprocess.DEVNULL, stdout=log, stderr=log, start_new_session=True, close_fds=True)
        return TaskState(key, started=time.time())

    def _hand_over(self, key: TaskKey, task_dir: str, order: dict) -> bool:
        """Send the order to the node-wide supervisor; False when there is none that works."""
        server = self.start_supervisor()
        if server is None or not self._send({"dir": task_dir, "order": order}):
            return False
        self._handed[key] = server
        return True

    def start_supervisor(self) -> subprocess.Popen | None:
        """The node-wide supervisor, started now unless it runs (None without ``node_wide``).

        The daemon starts it before the first task comes, so that task does
        not wait for a Python interpreter to start.
        """
        if not self.node_wide:
            return None
        server = self._server
        if server is None or server.poll() is not None:
            with open(os.path.join(self.layout.run_root, "supervisor.log"), "ab") as log:
                server = self._server = subprocess.Popen(
                    [self.python, "-m", "gpud.node.supervisor", "--feed", self.layout.tasks_dir], cwd="/",
                    env=child_env(), stdin=subprocess.PIPE, stdout=log, stderr=log, start_new_session=True,
                    close_fds=True)
            assert server.stdin is not None  # stdin=PIPE
            try:
                # Room for a burst of a few hundred orders, so handing them over never waits for the supervisor.
                fcntl.fcntl(server.stdin.fileno(), fcntl.F_SETPIPE_SZ, PIPE_BYTES)
            except OSError:
                pass  # the system's default size will do
        return server

    def _send(self, message: dict) -> bool:
        """Write one line to the node-wide supervisor; False (and the pipe closed) when it cannot be written."""
        line = jsontext.dumps(message) + "\n"
        pipe = self._server.stdin if self._server is not None else None
        try:
            if pipe is None:
                raise OSError("the supervisor was closed")
            pipe.write(line.encode("utf-8", "surrogateescape"))
            pipe.flush()
        except OSError:
            self.close()
            return False
        return True

    def close(self) -> None:
        """Stop handing tasks over: the supervisor finishes the tasks it has, then exits."""
        server, self._server = self._server, None
        if server is not None and server.stdin is not None:
            try:
                server.stdin.close()
            except OSError:
                pass

    def _handler(self, key: TaskKey) -> subprocess.Popen | None:
        """The supervisor process this launcher gave the task to, while it runs."""
        child = self._children.get(key) or self._handed.get(key)
        return child if child is not None and child.poll() is None else None

    def supervisor_alive(self, state: TaskState) -> bool:
        """True while the supervisor of the task is running (checked by pid and start time)."""
        if state.supervisor_pid is None:
            return self._handler(state.key) is not None
        return procs.same_process(state.supervisor_pid, state.supervisor_start)

    def request_stop(self, state: TaskState, reason: str, grace_s: float | None,
                     stop_signal: str | None = None, leader_only: bool = False, *, hasten: bool = False,
                     cause: ExitCause = ExitCause.STOPPED) -> bool:
        """Ask the task's supervisor to stop the task, its exit to say ``cause`` (and ``reason`` in words);
        False when no supervisor is alive to do it."""
        task_dir = self.layout.task_dir(state.key)
        os.makedirs(task_dir, mode=0o700, exist_ok=True)
        write_json(os.path.join(task_dir, STOP_FILE),
                   {"reason": reason, "cause": cause.value, "grace_s": grace_s, "signal": stop_signal,
                    "leader_only": leader_only, "hasten": hasten},
                   mode=0o644)
        if self._server is not None and self._handed.get(state.key) is self._server and self._server.poll() is None:
            # Behind the start order in the same pipe: the supervisor sees the stop file before it starts the
            # task, or this line after.
            return self._send({"stop": task_dir})
        current = read_state(task_dir) or state
        if current.supervisor_pid is None:
            # Not recorded yet: a supervisor of its own records its pid before it looks at the stop file.
            return self.supervisor_alive(current)
        if not self.supervisor_alive(current):
            return False
        try:
            os.kill(current.supervisor_pid, signal.SIGUSR1)
        except ProcessLookupError:
            return False
        return True

    def reap(self) -> None:
        """Collect the exit status of finished supervisors this daemon started; remove the spare cgroups of one
        that died (one that exits removes its own)."""
        for key, child in list(self._children.items()):
            if child.poll() is not None:
                del self._children[key]
        if self._server is not None and self._server.poll() is not None and self._swept is not self._server:
            self._swept = self._server
            if self._server.returncode != 0:
                cgspares.remove_stale(self.layout.tasks_dir)

    def forget(self, key: TaskKey) -> None:
        """Delete a finished task's directory (its output files in the workdir stay)."""
        self._children.pop(key, None)
        server = self._handed.pop(key, None)
        if server is not None and server is self._server and server.poll() is None \
                and self._send({"forget": self.layout.task_dir(key)}):
            return  # the supervisor that ran it deletes it, off this process
        self.delete(self.layout.task_dir(key))

    def delete(self, path: str) -> None:
        """Delete a directory tree soon, off the calling thread."""
        # Off the event loop: deleting a directory costs more than the rest of an exit report. One
        # deletion job at a time takes every directory doomed so far.
        with self._doomed_lock:
            self._doomed.append(path)
            if len(self._doomed) > 1:
                return
        self._deleter.submit(self._delete_doomed)

    def _delete_doomed(self) -> None:
        while True:
            with self._doomed_lock:
                if not self._doomed:
                    return
                doomed = list(self._doomed)
            for path in doomed:
                shutil.rmtree(path, ignore_errors=True)
            with self._doomed_lock:
                del self._doomed[:len(doomed)]
