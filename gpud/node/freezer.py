"""Freezing and thawing a task: the cgroup freezer (v2 ``cgroup.freeze``, v1 ``freezer.state``), else SIGSTOP/SIGCONT.

A task that runs time-sliced gets a freezer cgroup of its own when the
host has one we may write (the supervisor makes it, see
:func:`make_task_cgroup`); its path is kept in the task directory, so the
slicer, the supervisor and a restarted daemon all freeze and thaw the
same thing. Without one, the task's process group is stopped and
continued with signals.
"""

from __future__ import annotations

import os
import signal

CGROUP_ROOT = "/sys/fs/cgroup"
CGROUP_FILE = "cgroup"  # in the task directory: the task's freezer cgroup, when it has one
GROUP_NAME = "gpud"
FREEZER_ENV = "GPUD_FREEZER"  # "signal": never use the cgroup freezer, even where there is one


class Freezer:
    """Freezes and thaws one task; both calls are idempotent and never raise for a task that is gone."""

    kind = "none"

    def freeze(self) -> None:
        """Stop every process of the task."""

    def thaw(self) -> None:
        """Let every process of the task run again."""


class SignalFreezer(Freezer):
    """SIGSTOP/SIGCONT to the task's process group (its leader's pid)."""

    kind = "signal"

    def __init__(self, pgid: int) -> None:
        self.pgid = pgid

    def _send(self, sig: int) -> None:
        try:
            os.killpg(self.pgid, sig)
        except (ProcessLookupError, PermissionError):
            pass

    def freeze(self) -> None:
        """SIGSTOP the task's process group."""
        self._send(signal.SIGSTOP)

    def thaw(self) -> None:
        """SIGCONT the task's process group."""
        self._send(signal.SIGCONT)


class CgroupFreezer(Freezer):
    """The freezer of the task's own cgroup: v2 writes ``cgroup.freeze``, v1 writes ``freezer.state``."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.v2 = os.path.exists(os.path.join(path, "cgroup.freeze"))
        self.kind = "cgroup2" if self.v2 else "cgroup1"

    def _write(self, frozen: bool) -> None:
        name, value = ("cgroup.freeze", "1" if frozen else "0") if self.v2 else \
            ("freezer.state", "FROZEN" if frozen else "THAWED")
        try:
            with open(os.path.join(self.path, name), "w") as f:
                f.write(value)
        except OSError:
            pass  # the cgroup went away with the task

    def freeze(self) -> None:
        """Freeze the task's cgroup (the kernel stops its processes, whatever their groups or sessions)."""
        self._write(True)

    def thaw(self) -> None:
        """Thaw the task's cgroup."""
        self._write(False)


def _own_v2_cgroup(proc_file: str = "/proc/self/cgroup") -> str:
    """This process's cgroup v2 path ("/system.slice/gpud-node.service"), "/" when unknown."""
    try:
        with open(proc_file, encoding="utf-8") as f:
            for line in f:
                if line.startswith("0::"):
                    return line[3:].strip() or "/"
    except OSError:
        pass
    return "/"


def freezer_root(root: str = CGROUP_ROOT, proc_file: str = "/proc/self/cgroup") -> tuple[str, str] | None:
    """Where task freezer cgroups go, as (kind, directory): a writable v2 or v1 freezer hierarchy, or None.

    Under cgroup v2 that is inside our own cgroup when we may write there
    (systemd's Delegate=yes hands the node unit its subtree), else at the
    top. None when the environment variable GPUD_FREEZER is "signal".
    """
    if os.environ.get(FREEZER_ENV) == "signal":
        return None
    if os.path.exists(os.path.join(root, "cgroup.controllers")):
        own = os.path.join(root, _own_v2_cgroup(proc_file).lstrip("/"))
        for base in (own, root):
            if os.access(base, os.W_OK):
                return "cgroup2", os.path.join(base, GROUP_NAME)
        return None
    v1 = os.path.join(root, "freezer")
    if os.path.exists(os.path.join(v1, "freezer.state")) or os.path.exists(os.path.join(v1, "cgroup.procs")):
        if os.access(v1, os.W_OK):
            return "cgroup1", os.path.join(v1, GROUP_NAME)
    return None


def make_task_cgroup(task_dir: str, name: str, pid: int, root: str = CGROUP_ROOT) -> str | None:
    """Put process ``pid`` into a new freezer cgroup named ``name`` and record its path in ``task_dir``.

    Returns the cgroup's path, or None when the host has no freezer we may
    use (the task is then frozen with signals).
    """
    found = freezer_root(root)
    if found is None:
        return None
    _, base = found
    path = os.path.join(base, name)
    try:
        os.makedirs(path, exist_ok=True)
        with open(os.path.join(path, "cgroup.procs"), "w") as f:
            f.write(str(pid))
    except OSError:
        return None
    with open(os.path.join(task_dir, CGROUP_FILE), "w", encoding="utf-8") as f:
        f.write(path)
    return path


def remove_task_cgroup(task_dir: str) -> None:
    """Thaw and remove the task's freezer cgroup, once its processes are gone."""
    path = task_cgroup(task_dir)
    if path is None:
        return
    CgroupFreezer(path).thaw()
    try:
        os.rmdir(path)
    except OSError:
        pass


def task_cgroup(task_dir: str) -> str | None:
    """The freezer cgroup recorded for the task in ``task_dir``, or None."""
    try:
        with open(os.path.join(task_dir, CGROUP_FILE), encoding="utf-8") as f:
            path = f.read().strip()
    except OSError:
        return None
    return path if path and os.path.isdir(path) else None


def freezer_for(task_dir: str, pgid: int) -> Freezer:
    """The freezer of a task: its cgroup when it has one, else signals to its process group ``pgid``."""
    path = task_cgroup(task_dir)
    return CgroupFreezer(path) if path else SignalFreezer(pgid)
