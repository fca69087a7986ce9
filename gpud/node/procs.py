"""Linux process helpers: process identity across pid reuse, process groups, descendants, the child subreaper."""

from __future__ import annotations

import ctypes
import os
import signal

PR_SET_CHILD_SUBREAPER = 36


def start_ticks(pid: int) -> int | None:
    """When process ``pid`` started (clock ticks since boot), or None if there is no such process.

    A pid plus its start time names one process even after the pid is reused.
    """
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            data = f.read()
    except OSError:
        return None
    # The command name in parentheses may hold spaces; fields are counted after its closing ")".
    fields = data[data.rfind(b")") + 2:].split()
    return int(fields[19]) if len(fields) > 19 else None


def same_process(pid: int | None, ticks: int | None) -> bool:
    """True when ``pid`` is alive and is the process that started at ``ticks`` (not a zombie)."""
    if not pid:
        return False
    now = start_ticks(pid)
    if now is None or (ticks is not None and now != ticks):
        return False
    return _state(pid) not in ("Z", "X", None)


def _state(pid: int) -> str | None:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            data = f.read()
    except OSError:
        return None
    return data[data.rfind(b")") + 2:][:1].decode()


def group_alive(pgid: int) -> bool:
    """True while any process (zombies included) is left in process group ``pgid``."""
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def signal_group(pgid: int, sig: int) -> bool:
    """Send ``sig`` to process group ``pgid``; False when the group is already gone."""
    try:
        os.killpg(pgid, sig)
    except ProcessLookupError:
        return False
    return True


def descendants(pid: int) -> list[int]:
    """The pids of every living descendant of ``pid``, from /proc."""
    found = _descendants_from_children_files(pid)
    if found is not None:
        return found
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                data = f.read()
        except OSError:
            continue
        fields = data[data.rfind(b")") + 2:].split()
        if len(fields) > 1:
            children.setdefault(int(fields[1]), []).append(int(entry))
    found, todo = [], list(children.get(pid, ()))
    while todo:
        child = todo.pop()
        found.append(child)
        todo.extend(children.get(child, ()))
    return found


def _descendants_from_children_files(pid: int) -> list[int] | None:
    # /proc/PID/task/TID/children lists a thread's children: walking it costs
    # a few reads instead of one per process on the host. None when the
    # kernel does not provide it.
    found: list[int] = []
    todo = [pid]
    while todo:
        parent = todo.pop()
        kids = _children_files(parent)
        if kids is None:
            if parent == pid:
                return None
            continue
        found.extend(kids)
        todo.extend(kids)
    return found


def _children_files(pid: int) -> list[int] | None:
    """The children of ``pid`` from its threads' children files ([] when it is gone); None without such files."""
    found: list[int] = []
    try:
        threads = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return found
    for tid in threads:
        try:
            with open(f"/proc/{pid}/task/{tid}/children", "rb") as f:
                found.extend(int(k) for k in f.read().split())
        except FileNotFoundError:
            if not os.path.isdir(f"/proc/{pid}/task/{tid}"):
                continue  # the thread ended meanwhile
            return None
        except OSError:
            continue
    return found


def become_subreaper() -> bool:
    """Make orphaned descendants of this process its children (so none escapes it); False if unsupported."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def group_is_ours(pgid: int, leader_ticks: int | None) -> bool:
    """True when process group ``pgid`` still holds processes of the task whose leader started at ``leader_ticks``.

    A group outlives its leader, but once the group is gone its number may
    come back as a new process's pid: a living leader with another start
    time means the group is someone else's.
    """
    if not group_alive(pgid):
        return False
    ticks = start_ticks(pgid)
    return ticks is None or leader_ticks is None or ticks == leader_ticks


def children(pid: int) -> list[int]:
    """The pids of the living children of ``pid`` (every thread's), from /proc."""
    return _children_files(pid) or []


def environ_marks(pid: int, names: tuple[str, ...]) -> dict[str, str]:
    """The values of the environment variables ``names`` that process ``pid`` started with (those it has)."""
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            data = f.read()
    except OSError:
        return {}
    wanted = {name.encode() + b"=": name for name in names}
    found = {}
    for entry in data.split(b"\0"):
        for prefix, name in wanted.items():
            if entry.startswith(prefix):
                found[name] = entry[len(prefix):].decode("utf-8", "replace")
    return found


def kill_tree(pid: int) -> None:
    """SIGKILL ``pid`` and every descendant of it."""
    for victim in [pid, *descendants(pid)]:
        try:
            os.kill(victim, signal.SIGKILL)
        except OSError:
            pass
