"""The smallest requests of each queue: when all of them are blocked, so is every job of the queue."""

from __future__ import annotations

from typing import Protocol

from gpud.core.backlog import Backlog, Group
from gpud.core.queues import QueueState
from gpud.core.shapes import Dims, failure_dims, shape_key
from gpud.core.turns import Turns
from gpud.model import JobSpec


class StateView(Protocol):
    """What the covers read of the scheduler's state (``gpud.core.state.ClusterState``), named here
    so that this module does not import the state's."""

    backlog: Backlog
    job_specific_plugins: bool
    turns: Turns

    def pool_of(self, job: JobSpec) -> str:
        """The node pool a job runs in."""


class Sized:
    """A group's failure dimensions and its jobs' time limit (inf: none), as covers compare groups."""

    __slots__ = ("dims", "limit")

    def __init__(self, dims: Dims, limit: float) -> None:
        self.dims = dims
        self.limit = limit

    def at_least(self, other: Sized) -> bool:
        """True when this is at least ``other`` in every dimension and in its time limit."""
        return self.limit >= other.limit and self.dims.at_least(other.dims)


class _Cover:
    """One queue's groups by class with their dimensions, the minimal ones, and the backlog version seen."""

    __slots__ = ("version", "by_class", "minimal", "class_of", "partly_running", "groups")

    def __init__(self) -> None:
        self.version = -1
        self.by_class: dict[tuple, dict[Group, Sized]] = {}
        self.minimal: dict[tuple, list[tuple[Sized, Group]]] = {}
        self.class_of: dict[Group, tuple] = {}
        self.partly_running: set[Group] = set()
        self.groups: list[Group] | None = []


class QueueCovers:
    """For each queue, groups of pending jobs whose shapes every group of the queue is at least as large as.

    Shapes compare as the failure memory compares them (gpud.core.shapes),
    class by class, on size, CPUs, memory, the tasks that must start
    together and non-preemptibility, and on the time limit (a job that
    ends later is no easier to fit before a reservation starts). A queue with a group of a job that
    runs some of its tasks already has no cover: how many tasks it still
    needs changes as it runs. Kept across cycles: groups are added as they
    come, and a class is worked out afresh only when one of its minimal
    groups is emptied.
    """

    def __init__(self, state: StateView) -> None:
        self.state = state
        self._covers: dict[QueueState, _Cover] = {}
        self._by_shape: dict[tuple, tuple[tuple, Sized]] = {}  # a group's shape: its class and dimensions

    def of(self, queue: QueueState) -> list[Group] | None:
        """The queue's covering groups (empty when it has none waiting), None when it has no cover."""
        backlog = self.state.backlog
        version = backlog.shape_versions.get(queue, 0)
        cover = self._covers.get(queue)
        if cover is None:
            cover = self._covers[queue] = _Cover()
        elif cover.version == version:
            return cover.groups
        current = backlog.by_queue.get(queue, {})
        changed = backlog.reshaped(queue)
        if changed is None or cover.version < 0:  # the whole queue, once or after many changes
            gone = [g for g in cover.class_of if current.get(g.shape) is not g]
            made = [g for g in current.values() if g not in cover.class_of]
        else:  # only the groups made or emptied since: a warm cycle changes few of a long backlog's groups
            gone = [g for g in changed if current.get(g.shape) is not g and g in cover.class_of]
            made = [g for g in changed if current.get(g.shape) is g and g not in cover.class_of]
        stale: set[tuple] = set()
        for group in gone:
            klass = cover.class_of.pop(group)
            cover.partly_running.discard(group)
            if klass:
                del cover.by_class[klass][group]
                if any(g is group for _, g in cover.minimal[klass]):
                    stale.add(klass)
        for group in made:  # in the order made, so covers never vary
            self.state.turns.step()
            self._add(cover, group, stale)
        for klass in stale:
            found = cover.minimal[klass] = []
            for group, dims in cover.by_class[klass].items():
                _keep_minimal(found, dims, group)
        cover.groups = None if cover.partly_running else [
            group for found in cover.minimal.values() for _, group in found]
        cover.version = version
        return cover.groups

    def _add(self, cover: _Cover, group: Group, stale: set[tuple]) -> None:
        if group.shape[0] == "job":
            cover.class_of[group] = ()
            cover.partly_running.add(group)
            return
        known = self._by_shape.get(group.shape)
        if known is None:  # groups of one shape in different queues compare alike
            job = group.jobs[0]
            state = self.state
            klass, base = shape_key(job, state.pool_of(job), state.job_specific_plugins)
            limit = job.time_limit if job.time_limit is not None else float("inf")
            known = (klass, Sized(failure_dims(base, max(job.gang_minimum, 1), 0 if job.preemptible else 1), limit))
            self._by_shape[group.shape] = known
        klass, sized = known
        cover.class_of[group] = klass
        cover.by_class.setdefault(klass, {})[group] = sized
        if klass not in stale:
            _keep_minimal(cover.minimal.setdefault(klass, []), sized, group)


def _keep_minimal(found: list[tuple[Sized, Group]], sized: Sized, group: Group) -> None:
    """Add a group to a class's minimal groups unless one of them is at most as large (time limit included)."""
    covers_some = False
    for other, _ in found:  # a loop, not any() over a generator: every group of a fresh backlog passes here
        if sized.at_least(other):
            return
        if not covers_some and other.at_least(sized):
            covers_some = True
    if covers_some:
        found[:] = [(other, g) for other, g in found if not other.at_least(sized)]
    found.append((sized, group))
