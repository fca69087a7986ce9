"""Starting a task inside its cgroup v1 groups: a thread of the supervisor steps into them, forks the task, steps out.

A process starts in the cgroups of the thread that forked it. In cgroup v1
a thread may be in groups of its own: it joins a group by writing "0" to
the group's ``tasks`` file. A thread moving itself takes no lock the
host's other cgroup moves share, where moving a whole process takes the
global one, whose writer may wait for an RCU grace period. So the task's
first instruction runs within all its limits, counted, confined and
charged where it belongs, and nothing is moved after it started.

The thread is not the supervisor's main thread: the memory a process
allocates is charged to the memory group of the thread that owns its
address space (the main one), which must stay the supervisor's own.
"""

from __future__ import annotations

import os
import queue
import threading
from concurrent.futures import Future
from typing import Callable, TypeVar

T = TypeVar("T")
TASKS = "tasks"  # a v1 group's thread list: "0" written there moves the writing thread alone
SPAWNER_NICENESS = -10


class Refused(Exception):
    """A task's group refused the process or thread that was to start the task in it: nothing was started."""

    def __init__(self, error: OSError) -> None:
        super().__init__(error)
        self.reason = error.strerror or str(error)


def _join(group: str) -> None:
    """Move the calling thread alone into the v1 group at ``group``."""
    fd = os.open(os.path.join(group, TASKS), os.O_WRONLY | os.O_CLOEXEC)
    try:
        os.write(fd, b"0")
    finally:
        os.close(fd)


def _hasten() -> None:
    """Give the calling thread precedence over the tasks it forks, none of it passed on to them.

    While it forks a task the thread is in the task's cpuset: often the one
    CPU the task is pinned to. The task runs as soon as it has exec'd, and
    at an equal niceness the thread, woken then, waits for the task to
    yield that CPU (the whole of a short task). A lower niceness lets it
    take the CPU back at once; SCHED_RESET_ON_FORK starts every child at
    the default niceness. Where the supervisor may not (not root), the
    thread keeps the default and only waits longer.
    """
    try:
        os.sched_setscheduler(0, os.SCHED_OTHER | os.SCHED_RESET_ON_FORK, os.sched_param(0))
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), SPAWNER_NICENESS)
    except OSError:
        pass


class Spawner:
    """One thread that forks tasks from inside their v1 groups; :meth:`spawn` waits for it.

    ``home`` maps each hierarchy's mount directory to the supervisor's own
    group there: where the thread goes back to after each fork. It goes
    back after :meth:`spawn` has returned the forked task (moving a thread
    out of a task's cpu group may wait for the task to yield its CPU): what
    must find it gone from a task's groups waits for it (:meth:`wait_home`).
    """

    def __init__(self, home: dict[str, str]) -> None:
        self.home = home
        self._orders: queue.SimpleQueue[tuple[Callable[[], object], list[str], Future] | None] = \
            queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self._away = threading.Lock()  # held by the thread while it is out of the supervisor's groups

    def spawn(self, groups: list[str], start: Callable[[], T]) -> T:
        """Call ``start`` (it forks the task) on the spawner thread while that thread is in the v1 ``groups``
        (their directories).

        Returns what ``start`` returns, or raises what it raised. Refused
        (``start`` not called) when a group refuses the thread. When it
        raises, the thread is back in the supervisor's groups; when it
        returns, the thread may still be on its way back.
        """
        done: Future = Future()
        with self._lock:
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._serve, name="gpud-cgroup-spawner", daemon=True)
                self._thread.start()
            self._orders.put((start, groups, done))
        return done.result()

    def wait_home(self) -> None:
        """Return once the spawner thread is in the supervisor's groups, not in a task's (or has ended)."""
        with self._away:
            pass

    def close(self) -> None:
        """End the spawner thread (a later :meth:`spawn` starts a new one)."""
        with self._lock:
            thread, self._thread = self._thread, None
            if thread is not None and thread.is_alive():
                self._orders.put(None)
        if thread is not None:
            thread.join()

    def _serve(self) -> None:
        _hasten()
        while True:
            order = self._orders.get()
            if order is None:
                return
            start, groups, done = order
            with self._away:
                try:
                    home = self._run(start, groups, done)
                except BaseException as exc:  # noqa: BLE001 - not known where it is: the thread ends, as below
                    if not done.done():
                        done.set_exception(exc)
                    home = False
            if not home:
                # Still in a task's group: a thread that ends leaves every group; the next spawn starts a new one.
                with self._lock:
                    if self._thread is threading.current_thread():
                        self._thread = None
                return

    def _run(self, start: Callable[[], object], groups: list[str], done: Future) -> bool:
        """Enter ``groups``, call ``start``, settle ``done`` and go home (home first when ``start`` was not called or
        raised). False when the thread could not go home."""
        entered: list[str] = []
        try:
            for path in groups:
                _join(path)
                entered.append(path)
        except OSError as exc:  # the task must not start outside any of its groups
            home = self._go_home(entered)
            done.set_exception(Refused(exc))
            return home
        try:
            result = start()
        except BaseException as exc:  # noqa: BLE001 - handed to the caller, on its own thread
            home = self._go_home(entered)
            done.set_exception(exc)
            return home
        done.set_result(result)  # the task runs in its groups: its supervisor goes on while this thread goes home
        return self._go_home(entered)

    def _go_home(self, entered: list[str]) -> bool:
        """Move this thread back to the supervisor's groups of the hierarchies of ``entered``; False when one refused."""
        ok = True
        for path in entered:
            mount = os.path.dirname(os.path.dirname(path))
            try:
                _join(self.home.get(mount, mount))
            except OSError:
                ok = False
        return ok
