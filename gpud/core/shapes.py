"""Remembering requests that failed, so a request at least as large is refused without a search."""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable, Protocol

from gpud.model import Blocker, JobSpec

if TYPE_CHECKING:
    from gpud.core.backlog import Group


class StateView(Protocol):
    """What the shape memory reads of the scheduler's state (``gpud.core.state.ClusterState``),
    named here so that this module does not import the state's."""

    job_specific_plugins: bool
    shapes: ShapeIndex

    def pool_of(self, job: JobSpec) -> str:
        """The node pool a job runs in."""


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


class Dims:
    """A request's dimensions as the failure memory compares them: its shape's ``size`` (GPUs, or a
    slice's GPU memory), ``cpu`` and ``memory``, the ``tasks`` that must start together, and the
    caller's ``own`` dimension (larger means harder)."""

    __slots__ = ("size", "cpu", "memory", "tasks", "own")

    def __init__(self, size: float, cpu: float, memory: float, tasks: int, own: int) -> None:
        self.size = size
        self.cpu = cpu
        self.memory = memory
        self.tasks = tasks
        self.own = own

    def at_least(self, other: Dims) -> bool:
        """True when these dimensions are at least ``other``'s, every one."""
        return (self.size >= other.size and self.cpu >= other.cpu and self.memory >= other.memory
                and self.tasks >= other.tasks and self.own >= other.own)


def failure_dims(base: tuple[float, float, float], tasks: int, own: int = 0) -> Dims:
    """A request's dimensions (``Dims``) from its shape's size, CPUs and memory (``shape_key``)."""
    return Dims(base[0], base[1], base[2], tasks, own)


class Failure:
    """A request that failed: its dimensions (as ``Dims`` names them), the ``blocker`` it met (None
    when the caller keeps no reason) and the ``kind`` of wait (the caller's word; "" when none).

    A caller may give, instead of the blocker, ``explain``, which makes it:
    it is then made when first read. ``has_blocker`` says whether there is
    one without making it.
    """

    __slots__ = ("size", "cpu", "memory", "tasks", "own", "kind", "has_blocker", "_blocker", "_explain")

    def __init__(self, dims: Dims, blocker: Blocker | None, kind: str,
                 explain: Callable[[], Blocker] | None = None) -> None:
        self.size: float = dims.size
        self.cpu: float = dims.cpu
        self.memory: float = dims.memory
        self.tasks: int = dims.tasks
        self.own: int = dims.own
        self.kind = kind
        self.has_blocker = blocker is not None or explain is not None
        self._blocker = blocker
        self._explain = explain

    @property
    def blocker(self) -> Blocker | None:
        """The blocker the request met, made now if it was left to ``explain``."""
        if self._explain is not None:
            self._blocker, self._explain = self._explain(), None
        return self._blocker

    def covers(self, dims: Dims) -> bool:
        """True when a request of ``dims`` is at least as large as this failure."""
        return (dims.size >= self.size and dims.cpu >= self.cpu and dims.memory >= self.memory
                and dims.tasks >= self.tasks and dims.own >= self.own)

    def within(self, other: Failure) -> bool:
        """True when this failure is at least as large as ``other`` in every dimension."""
        return (self.size >= other.size and self.cpu >= other.cpu and self.memory >= other.memory
                and self.tasks >= other.tasks and self.own >= other.own)


class _Answer:
    """The failure found for one exact request of a shape: so many tasks, this own dimension."""

    __slots__ = ("tasks", "own", "failure")

    def __init__(self, tasks: int, own: int, failure: Failure) -> None:
        self.tasks = tasks
        self.own = own
        self.failure = failure


class ShapeIndex:
    """Each job's shape (``shape_key``) worked out once per job and numbered, and each class numbered."""

    def __init__(self, state: StateView) -> None:
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

    def __init__(self, state: StateView) -> None:
        self.state = state
        self._index: ShapeIndex = state.shapes
        self._frontier: dict[int, list[Failure]] = {}  # by class number
        # By shape number: the failure found for each exact request asked about. It stays the answer,
        # so a job keeps its reason. A short list per shape, read without hashing a key.
        self._answers: list[list[_Answer] | None] = []
        self._version = 0

    def add(self, job: JobSpec, tasks: int, detail: Blocker | None, kind: str = "", own: int = 0,
            binding: tuple[str, ...] | None = None, explain: Callable[[], Blocker] | None = None) -> None:
        """Remember that ``tasks`` tasks of ``job`` failed, why, and the kind of wait.

        ``own`` adds a dimension of the caller's own (larger means harder).
        ``binding``, when given, names resources ("gpu", "cpu", "memory")
        whose amounts alone made the request fail: the others are remembered
        as none, so a request at least as large in those fails too, whatever
        it asks of the others. (A GPU request's size stands for its GPUs.)
        ``explain``, instead of ``detail``, makes the blocker when first read.
        """
        index = self._index
        sid = index.of(job)
        size, cpu, mem = index.shapes[sid][1]
        if binding is not None:
            size = size if "gpu" in binding else 0.0
            cpu = cpu if "cpu" in binding else 0.0
            mem = mem if "memory" in binding else 0.0
        klass = index.class_of[sid]
        frontier = self._frontier.get(klass)
        if frontier is None:
            frontier = self._frontier[klass] = []
        dims = Dims(size, cpu, mem, tasks, own)
        failure = Failure(dims, detail, kind, explain)
        covers_some = False
        for failed in frontier:
            if failed.covers(dims):
                return
            if not covers_some and failed.within(failure):
                covers_some = True
        if covers_some:  # the failures it is smaller than are no longer minimal
            frontier[:] = [failed for failed in frontier if not failed.within(failure)]
        frontier.append(failure)
        self._version += 1

    @property
    def version(self) -> int:
        """A number that changes whenever a failure is remembered: answers given before hold while it stays."""
        return self._version

    def frozen(self) -> dict[tuple, list[Failure]]:
        """A copy of the failures remembered now, by class, for ``first_covering``."""
        classes = self._index.classes
        return {classes[klass]: list(failed) for klass, failed in self._frontier.items()}

    def find(self, job: JobSpec, tasks: int, own: int = 0, sid: int = -1) -> Failure | None:
        """A failed request this one is at least as large as (its blocker and kind), or None.

        ``sid``, when known (``ShapeIndex.of_group``), is the number of the job's shape.
        """
        if not self._frontier:
            return None
        index = self._index
        if sid < 0:
            found_sid = index._of_job.get(job.id)  # index.of(job), inline for a job seen before: the common case
            sid = found_sid if found_sid is not None else index.of(job)
        answers = self._answers
        known = answers[sid] if sid < len(answers) else None
        if known is not None:
            for answer in known:
                if answer.tasks == tasks and answer.own == own:
                    return answer.failure
        failures = self._frontier.get(index.class_of[sid])
        if not failures:
            return None
        size, cpu, mem = index.shapes[sid][1]
        for failed in failures:  # Failure.covers, inline: the size alone rules most out, cheaply
            if (size >= failed.size and cpu >= failed.cpu and mem >= failed.memory and tasks >= failed.tasks
                    and own >= failed.own):
                # Found is kept; none found is not: a failure remembered later may cover it.
                if known is None:
                    if sid >= len(answers):
                        answers.extend([None] * (sid + 1 - len(answers)))
                    known = answers[sid] = []
                known.append(_Answer(tasks, own, failed))
                return failed
        return None


def first_covering(frontier: dict[tuple, list[Failure]], group: tuple, dims: Dims) -> Failure | None:
    """The first failure in a ``FailedShapes.frozen`` copy that ``dims`` is at least as large as."""
    for failed in frontier.get(group, ()):
        if failed.covers(dims):
            return failed
    return None
