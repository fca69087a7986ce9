"""Remembering requests that failed, so a request at least as large is refused without a search."""

from __future__ import annotations

from typing import TYPE_CHECKING, Iterable

from gpud.model import JobSpec

if TYPE_CHECKING:
    from gpud.core.backlog import Group
    from gpud.core.state import ClusterState


Dims = tuple[float, float, float, int, int]  # (size, CPUs, memory, tasks, the caller's own dimension)


def shape_key(job: JobSpec, pool: str, job_specific: bool) -> tuple[tuple, tuple[float, float, float]]:
    """A job's shape as the failure memory compares it: (class, (size, CPUs, memory)).

    The class is the pool, node selector and kind (whole GPUs, fractions,
    memory slices, CPU-only), and the job itself when plugins judge job by job.
    """
    r = job.request
    size: float
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


def failure_dims(base: tuple[float, float, float], tasks: int, extra: tuple = ()) -> Dims:
    """A request's dimensions as the failure memory compares them: its shape's size, CPUs and memory,
    the tasks that must start together and the caller's own dimension (``extra``, at most one; 0 if none)."""
    return (base[0], base[1], base[2], tasks, extra[0] if extra else 0)


def at_least(dims: Dims, other: Dims) -> bool:
    """True when ``dims`` is at least ``other`` in every dimension."""
    return (dims[0] >= other[0] and dims[1] >= other[1] and dims[2] >= other[2] and dims[3] >= other[3]
            and dims[4] >= other[4])


class ShapeIndex:
    """Each job's shape (``shape_key``) worked out once per job and numbered, and each class numbered."""

    def __init__(self, state: ClusterState) -> None:
        self.state = state
        self._of_job: dict[str, int] = {}
        self._ids: dict[tuple, int] = {}
        self.shapes: list[tuple[tuple, tuple[float, float, float]]] = []
        self.class_of: list[int] = []  # by shape number: the number of its class
        self.classes: list[tuple] = []  # by class number
        self._class_ids: dict[tuple, int] = {}

    def of(self, job: JobSpec) -> int:
        """The number of the job's shape."""
        sid = self._of_job.get(job.id)
        if sid is None:
            base = shape_key(job, self.state.pool_of(job), self.state.job_specific_plugins)
            sid = self._ids.get(base)
            if sid is None:
                sid = self._ids[base] = len(self.shapes)
                self.shapes.append(base)
                klass = self._class_ids.get(base[0])
                if klass is None:
                    klass = self._class_ids[base[0]] = len(self.classes)
                    self.classes.append(base[0])
                self.class_of.append(klass)
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
        self._frontier: dict[int, list[tuple[Dims, tuple[str, str]]]] = {}  # by class number
        # The failure found for each exact request asked about: it stays the answer, so a job keeps its reason.
        self._answers: dict[tuple[int, int, int], tuple[str, str]] = {}
        self._version = 0

    def add(self, job: JobSpec, tasks: int, detail: str, kind: str = "", extra: tuple = (),
            binding: Iterable[str] | None = None) -> None:
        """Remember that ``tasks`` tasks of ``job`` failed, why, and the kind of wait.

        ``extra`` adds a dimension of the caller's own (larger means harder).
        ``binding``, when given, names resources ("gpu", "cpu", "memory")
        whose amounts alone made the request fail: the others are remembered
        as none, so a request at least as large in those fails too, whatever
        it asks of the others. (A GPU request's size stands for its GPUs.)
        """
        index = self._index
        sid = index.of(job)
        base = index.shapes[sid][1]
        if binding is not None:
            kept = set(binding)
            base = (base[0] if "gpu" in kept else 0.0, base[1] if "cpu" in kept else 0.0,
                    base[2] if "memory" in kept else 0.0)
        dims = failure_dims(base, tasks, extra)
        frontier = self._frontier.setdefault(index.class_of[sid], [])
        covers_some = False
        for failed, _ in frontier:
            if at_least(dims, failed):
                return
            if not covers_some and at_least(failed, dims):
                covers_some = True
        if covers_some:  # the failures it is smaller than are no longer minimal
            frontier[:] = [(f, why) for f, why in frontier if not at_least(f, dims)]
        frontier.append((dims, (detail, kind)))
        self._version += 1

    @property
    def version(self) -> int:
        """A number that changes whenever a failure is remembered: answers given before hold while it stays."""
        return self._version

    def frozen(self) -> dict[tuple, list[tuple[Dims, tuple[str, str]]]]:
        """A copy of the failures remembered now, by class, for ``first_covering``."""
        classes = self._index.classes
        return {classes[klass]: list(failed) for klass, failed in self._frontier.items()}

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
        own = extra[0] if extra else 0
        key = (sid, tasks, own)
        known = self._answers.get(key)
        if known is not None:
            return known
        found = None
        failures = self._frontier.get(index.class_of[sid])
        if failures:
            size, cpu, mem = index.shapes[sid][1]
            for failed, why in failures:  # at_least, inline: the size alone rules most out, cheaply
                if (size >= failed[0] and cpu >= failed[1] and mem >= failed[2] and tasks >= failed[3]
                        and own >= failed[4]):
                    found = why
                    break
        if found is not None:  # none found is not kept: a failure remembered later may cover it
            self._answers[key] = found
        return found


def first_covering(frontier: dict[tuple, list[tuple[Dims, tuple[str, str]]]], group: tuple,
                   dims: Dims) -> tuple[str, str] | None:
    """(reason, kind) of the first failure in a ``FailedShapes.frozen`` copy that ``dims`` is at least as large as."""
    for failed, why in frontier.get(group, ()):
        if at_least(dims, failed):
            return why
    return None
