"""Spare task cgroups: a finished task's v1 groups, emptied, kept for the next task with the same limits.

Making a task's v1 groups (a directory in each hierarchy, then its limits)
and removing them (each rmdir, then the kernel's offlining of the memory
group) is most of what a task's cgroups cost its start, besides moving
processes. When a task has ended and its groups are empty, they are reset
(peak memory, CPU time, the memory still charged to them past a little) and renamed to a
spare name in place, which cgroup v1 allows; the next task with the same
limits renames them to its own name and writes nothing but its CPU quota
(which refills the current period's). So every group is
named after the task it holds while it runs, and a task's groups are gone
under its name once it ended, as without spares.

A group is kept only when nothing is left in it, its task was not killed
for memory (the OOM count cannot be reset) and every reset took; else it is
removed. cgroup v2 groups cannot be renamed: a task always gets a new one.

A spare's name says which supervisor keeps it (``TAG-spare-PID-START-N``,
TAG the node's): the supervisor removes its spares when it exits, and a
node daemon or fence removes those of a supervisor that died
(:func:`remove_stale`), and the groups still named after a task whose
directory is gone. Task directory names always hold a dot; spare names
never do.
"""

from __future__ import annotations

import os
import re
import threading

from gpud.node import procs
from gpud.node.cgroups import Hierarchies, Limits, TaskCgroup, _read, _write, cgroup_name, host

MAX_SPARES = 32  # idle sets of v1 groups one supervisor keeps (a node's tasks have a few shapes: one per GPU, say)
# What a spare's memory group may keep charged: the kernel's per-CPU charge caches and the kernel objects a short task
# leaves (a few hundred KiB after `true`), which emptying would not free either, or only by draining every CPU's cache,
# costing more CPU than such a task. More, and the group is emptied; if it is still more after that, it is removed:
# the next task would start with less than its limit.
MAX_LEFT_CHARGED = 1 << 20
_SPARE = re.compile(r"^(?P<tag>[0-9a-f]+)-spare-(?P<pid>\d+)-(?P<start>\d+)-\d+$")


def spare_key(group: TaskCgroup, limits: Limits) -> tuple:
    """What a spare must match to serve a task: the same v1 hierarchies and the same limits."""
    return tuple(sorted(group.v1)), limits


class Spares:
    """One supervisor's spare v1 groups, by :func:`spare_key`; taken on its loop, put back on its cgroup worker."""

    def __init__(self) -> None:
        self._idle: dict[tuple, list[dict[str, str]]] = {}
        self._lock = threading.Lock()
        self._serial = 0
        pid = os.getpid()
        self._owner = f"{pid}-{procs.start_ticks(pid) or 0}"

    def count(self) -> int:
        """How many sets of spare groups are kept now."""
        with self._lock:
            return sum(len(kept) for kept in self._idle.values())

    def take(self, group: TaskCgroup, limits: Limits) -> bool:
        """Give ``group`` a spare set of v1 groups with ``limits`` (renamed to its name); False when none fits.

        When a rename fails, the renamed part is kept (its limits are the
        task's), the rest removed: the caller makes and limits ``group`` as new.
        """
        key = spare_key(group, limits)
        with self._lock:
            kept = self._idle.get(key)
            spare = kept.pop() if kept else None
        if spare is None:
            return False
        for controller, path in spare.items():
            try:
                os.rename(path, group.v1[controller])
            except OSError:
                _remove_paths([p for c, p in spare.items() if os.path.isdir(p)])
                return False
        try:
            # What the earlier tasks ran this period would count against this one: it could start throttled.
            group.limit_cpu_time(limits)
        except OSError:
            group.remove()
            return False
        return True

    def park(self, group: TaskCgroup, limits: Limits, reusable: bool) -> None:
        """Keep the v1 groups of a finished task as spares when they may serve another task, else remove them.

        Runs on the cgroup worker, after the task's end is reported; its v2
        group is removed either way.
        """
        if not reusable or not group.v1 or self.count() >= MAX_SPARES or not _reset(group):
            group.remove()
            return
        if group.v2:
            TaskCgroup(group.name, Hierarchies(v2=group.hierarchies.v2)).remove()
        tag = group.name.partition("-")[0]
        with self._lock:
            self._serial += 1
            name = f"{tag}-spare-{self._owner}-{self._serial}"
        spare: dict[str, str] = {}
        for controller, path in group.v1.items():
            target = os.path.join(os.path.dirname(path), name)
            try:
                os.rename(path, target)
            except OSError:
                group.remove()
                _remove_paths(list(spare.values()))
                return
            spare[controller] = target
        with self._lock:
            self._idle.setdefault(spare_key(group, limits), []).append(spare)

    def clear(self) -> None:
        """Remove every spare (the supervisor is exiting)."""
        with self._lock:
            kept = [path for sets in self._idle.values() for spare in sets for path in spare.values()]
            self._idle.clear()
        _remove_paths(kept)


def _reset(group: TaskCgroup) -> bool:
    """Make a finished task's empty v1 groups as good as new for the next task; False when they are not empty
    or a reset did not take."""
    try:
        for path in group.v1.values():
            if _read(os.path.join(path, "cgroup.procs")):
                return False
        memory = group.v1.get("memory")
        if memory:
            usage = os.path.join(memory, "memory.usage_in_bytes")
            if int(_read(usage)) > MAX_LEFT_CHARGED:
                _write(os.path.join(memory, "memory.force_empty"), "0")  # what the task left charged (page cache)
                if int(_read(usage)) > MAX_LEFT_CHARGED:
                    return False
            _write(os.path.join(memory, "memory.max_usage_in_bytes"), "0")  # the peak starts again from 0
        cpuacct = group.v1.get("cpuacct")
        if cpuacct:
            _write(os.path.join(cpuacct, "cpuacct.usage"), "0")
        freezer = group.v1.get("freezer")
        if freezer and _read(os.path.join(freezer, "freezer.state")) != "THAWED":
            return False
    except (OSError, ValueError):
        return False
    return True


def _remove_paths(paths: list[str]) -> None:
    for path in paths:
        TaskCgroup(os.path.basename(path), Hierarchies(v1={"any": os.path.dirname(path)})).remove()


def remove_stale(tasks_dir: str, hierarchies: Hierarchies | None = None) -> int:
    """Remove this node's cgroups that no live supervisor keeps; returns how many.

    Those are the spares of supervisors no longer alive, and the groups
    named after a task whose directory is gone: a supervisor that died
    after the daemon forgot the ended task (deleting its directory, which
    records the groups) but before it kept them as spares left them under
    the task's name, where nothing else would ever find them.
    """
    found = host() if hierarchies is None else hierarchies
    tag = cgroup_name(tasks_dir, "").rstrip("-")
    removed = 0
    for base in [*found.v1.values(), *([found.v2] if found.v2 else [])]:
        try:
            names = os.listdir(base)
        except OSError:
            continue
        for name in names:
            if not _unkept(name, tag, tasks_dir):
                continue
            group = TaskCgroup(name, Hierarchies(v1={"any": base}))
            group.kill()  # nothing should be in it; whatever is there must not outlive it unwatched
            if group.remove():
                removed += 1
    return removed


def _unkept(name: str, tag: str, tasks_dir: str) -> bool:
    """True for a group of the node tagged ``tag`` that no live supervisor keeps: a spare of one no longer alive,
    or a group named after a task (its directory name holds a dot) whose directory is gone."""
    spare = _SPARE.match(name)
    if spare is not None:
        return spare["tag"] == tag and not procs.same_process(int(spare["pid"]), int(spare["start"]))
    owner, _, dirname = name.partition("-")
    return owner == tag and "." in dirname and not os.path.isdir(os.path.join(tasks_dir, dirname))
