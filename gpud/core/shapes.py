"""Remembering requests that failed, so a request at least as large is refused without a search."""

from __future__ import annotations

from operator import ge
from typing import TYPE_CHECKING, Iterable

from gpud.model import RESOURCES, JobSpec

if TYPE_CHECKING:
    from gpud.core.backlog import Group
    from gpud.core.state import ClusterState


def shape_key(job: JobSpec, pool: str, job_specific: bool) -> tuple[tuple, tuple]:
    """A job's shape as the failure memory compares it: (class, (size, CPUs, memory)).

    The class is the pool, node selector and kind (whole GPUs, fractions,
    memory slices, CPU-only), and the job itself when plugins judge job by job.
    """
    r = job.request
    if not r.uses_gpu:
        kind, size = "cpu", 0.0
    elif r.gpu_memory_gib is not None:
        kind, size = "memory", r.gpu_memory_gib
    else:
        kind, size = ("fraction" if r.is_shared else "whole"), r.gpus
    selector = tuple(sorted(job.node_selector.items())) if job.node_selector else ()
    group: tuple = (pool, selector, kind)
    if job_specific:
        group += (job.id,)
    return group, (size, r.cpus, r.memory_gib)


class ShapeIndex:
    """Each job's shape (``shape_key``) worked out once per job and numbered."""

    def __init__(self, state: ClusterState) -> None:
        self.state = state
        self._of_job: dict[str, int] = {}
        self._ids: dict[tuple, int] = {}
        self.shapes: list[tuple[tuple, tuple]] = []

    def of(self, job: JobSpec) -> int:
        """The number of the job's shape."""
        sid = self._of_job.get(job.id)
        if sid is None:
            base = shape_key(job, self.state.pool_of(job), self.state.job_specific_plugins)
            sid = self._ids.get(base)
            if sid is None:
                sid = self._ids[base] = len(self.shapes)
                self.shapes.append(base)
            self._of_job[job.id] = sid
        return sid

    def of_group(self, group: Group) -> int:
        """The number of the shape every job of a backlog group shares, kept on the group."""
        sid = group.sid
        if sid < 0:
            sid = group.sid = self.of(group.jobs[0])
        return sid

    def forget(self, job_id: str) -> None:
        """Drop a job that left (its id may come back with another request)."""
        self._of_job.pop(job_id, None)


class FailedShapes:
    """Requests that found no room; a request at least as large cannot succeed either.

    Valid while what makes requests succeed only shrinks (free capacity
    during allocation, victims during reclaim). Shapes are grouped by pool,
    node selector and kind (whole GPUs, fractions, memory slices, CPU-only),
    since a fraction may fit where a whole GPU does not. Only the minimal
    failed shapes are kept, and answers are remembered per exact shape.
    When plugins judge nodes or victims job by job, a failure speaks for
    that job only.
    """

    def __init__(self, state: ClusterState) -> None:
        self.state = state
        self._index: ShapeIndex = state.shapes
        self._frontier: dict[tuple, list[tuple[tuple, tuple[str, str]]]] = {}
        self._answers: dict[tuple, tuple[int, tuple[str, str] | None]] = {}
        self._version = 0

    def _shape(self, job: JobSpec, tasks: int, extra: tuple) -> tuple[tuple, tuple]:
        group, base = self._index.shapes[self._index.of(job)]
        return group, (*base, tasks, *extra)

    def add(self, job: JobSpec, tasks: int, detail: str, kind: str = "", extra: tuple = (),
            binding: Iterable[str] | None = None) -> None:
        """Remember that ``tasks`` tasks of ``job`` failed, why, and the kind of wait.

        ``extra`` adds dimensions of the caller's own (larger means harder).
        ``binding``, when given, names resources ("gpu", "cpu", "memory")
        whose amounts alone made the request fail: the others are remembered
        as none, so a request at least as large in those fails too, whatever
        it asks of the others. (A GPU request's size stands for its GPUs.)
        """
        group, dims = self._shape(job, tasks, extra)
        if binding is not None:
            kept = set(binding)
            dims = tuple(0.0 if resource not in kept else amount
                         for resource, amount in zip(RESOURCES, dims[:3])) + dims[3:]
        frontier = self._frontier.setdefault(group, [])
        for failed, _ in frontier:
            if all(map(ge, dims, failed)):
                return
        frontier[:] = [(f, why) for f, why in frontier if not all(map(ge, f, dims))]
        frontier.append((dims, (detail, kind)))
        self._version += 1

    @property
    def version(self) -> int:
        """A number that changes whenever a failure is remembered: answers given before hold while it stays."""
        return self._version

    def frozen(self) -> dict[tuple, list[tuple[tuple, tuple[str, str]]]]:
        """A copy of the failures remembered now, by class, for ``first_covering``."""
        return {group: list(failed) for group, failed in self._frontier.items()}

    def find(self, job: JobSpec, tasks: int, extra: tuple = (), sid: int = -1) -> tuple[str, str] | None:
        """(reason, kind) of a failed request this one is at least as large as, or None.

        ``sid``, when known (``ShapeIndex.of_group``), is the number of the job's shape.
        """
        if not self._frontier:
            return None
        index = self._index
        if sid < 0:
            found_sid = index._of_job.get(job.id)  # index.of(job), inline for a job seen before: the common case
            sid = found_sid if found_sid is not None else index.of(job)
        key = (sid, tasks, extra)
        known = self._answers.get(key)
        if known is not None and (known[1] is not None or known[0] == self._version):
            return known[1]
        group, base = self._index.shapes[sid]
        dims: tuple = (base[0], base[1], base[2], tasks)  # (size, CPUs, memory) and tasks, as ``_shape`` makes them
        if extra:
            dims += extra
        found = None
        size = dims[0]
        for failed, why in self._frontier.get(group, ()):
            if size >= failed[0] and all(map(ge, dims, failed)):  # the size alone rules most out, cheaply
                found = why
                break
        self._answers[key] = (self._version, found)
        return found


def first_covering(frontier: dict[tuple, list[tuple[tuple, tuple[str, str]]]], group: tuple,
                   dims: tuple) -> tuple[str, str] | None:
    """(reason, kind) of the first failure in a ``FailedShapes.frozen`` copy that ``dims`` is at least as large as."""
    for failed, why in frontier.get(group, ()):
        if all(map(ge, dims, failed)):
            return why
    return None
