"""The immutable types the scheduling core reads (snapshots) and writes (plans).

The types made by the thousand (jobs copied at commit, amounts, placements,
binds, evictions, and the reasons of jobs as a cycle finds them and as they
are read) write their ``__init__`` out, setting each field as a frozen
dataclass's generated one does: a compiled core (GPUD_COMPILE) compiles a
written ``__init__``, where the generated one stays an interpreted function,
about 25 times slower to call. tests/core/test_model_init.py holds each to
its fields, their order and defaults.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Final, Mapping

# Final: the compiled core (GPUD_COMPILE) reads these as constants, not from the module at each use.
EPS: Final = 1e-9
RESOURCES: Final = ("gpu", "cpu", "memory")
NON_PREEMPTIBLE_PRIORITY: Final = 100


@dataclass(frozen=True, slots=True)
class Resources:
    """An amount of GPUs (fractions allowed), CPU cores and memory in GiB."""

    gpu: float = 0.0
    cpu: float = 0.0
    memory: float = 0.0

    def __init__(self, gpu: float = 0.0, cpu: float = 0.0, memory: float = 0.0) -> None:
        object.__setattr__(self, "gpu", gpu)
        object.__setattr__(self, "cpu", cpu)
        object.__setattr__(self, "memory", memory)

    def __add__(self, other: Resources) -> Resources:
        return Resources(self.gpu + other.gpu, self.cpu + other.cpu, self.memory + other.memory)

    def __sub__(self, other: Resources) -> Resources:
        return Resources(self.gpu - other.gpu, self.cpu - other.cpu, self.memory - other.memory)

    def scaled(self, factor: float) -> Resources:
        """This amount multiplied by ``factor`` in every resource."""
        return Resources(self.gpu * factor, self.cpu * factor, self.memory * factor)

    def get(self, name: str) -> float:
        """The amount of one resource by name: "gpu", "cpu" or "memory"."""
        return getattr(self, name)

    def fits_in(self, other: Resources) -> bool:
        """True when no resource of this amount exceeds ``other`` (with float tolerance)."""
        return (self.gpu <= other.gpu + EPS and self.cpu <= other.cpu + EPS
                and self.memory <= other.memory + EPS)


ZERO: Final = Resources()


@dataclass(frozen=True, slots=True)
class NodeSpec:
    """One GPU host as the scheduler sees it."""

    name: str
    gpus: int = 0
    gpu_memory_gib: float = 80.0
    cpus: float = 64.0
    memory_gib: float = 512.0
    pool: str = "default"
    labels: Mapping[str, str] = field(default_factory=dict)
    schedulable: bool = True
    out_of_service: tuple[int, ...] = ()

    @property
    def usable_gpus(self) -> int:
        """The GPUs that can take work: all of them but those out of service (lost, faulty)."""
        return self.gpus - len(self.out_of_service)


@dataclass(frozen=True, slots=True)
class TaskRequest:
    """What one task of a job asks for.

    ``gpus`` is a whole number of GPUs, or a fraction (0 < gpus < 1) of one GPU.
    ``gpu_memory_gib``, when set, asks for a slice of one GPU's memory instead.
    """

    gpus: float = 0.0
    gpu_memory_gib: float | None = None
    cpus: float = 1.0
    memory_gib: float = 1.0

    @property
    def is_shared(self) -> bool:
        """True when the task takes part of one GPU (a fraction or a memory slice)."""
        return self.gpu_memory_gib is not None or 0 < self.gpus < 1

    @property
    def whole_gpus(self) -> int:
        """The number of whole GPUs the task holds (0 for shared and CPU-only tasks)."""
        return 0 if self.is_shared else int(self.gpus)

    @property
    def uses_gpu(self) -> bool:
        """True for GPU tasks, False for CPU-only ones."""
        return self.gpus > 0 or self.gpu_memory_gib is not None

    def gpu_share_on(self, gpu_memory_gib: float) -> float:
        """The part of one GPU with ``gpu_memory_gib`` of memory a shared task takes."""
        if self.gpu_memory_gib is not None:
            return self.gpu_memory_gib / gpu_memory_gib
        return self.gpus


@dataclass(frozen=True, slots=True)
class TaskPlacement:
    """Where a task runs: a node, the GPU indices it holds and the share of each it takes."""

    node: str
    gpu_index: tuple[int, ...] = ()
    gpu_share: float = 1.0

    def __init__(self, node: str, gpu_index: tuple[int, ...] = (), gpu_share: float = 1.0) -> None:
        object.__setattr__(self, "node", node)
        object.__setattr__(self, "gpu_index", gpu_index)
        object.__setattr__(self, "gpu_share", gpu_share)


@dataclass(frozen=True, slots=True)
class JobSpec:
    """A job of one or more tasks; ``placements`` holds one entry per task, None when pending."""

    id: str
    project: str
    request: TaskRequest
    priority: int = 50
    tasks: int = 1
    min_tasks: int | None = None
    submitted: float = 0.0
    started: float | None = None
    placements: tuple[TaskPlacement | None, ...] = ()
    node_selector: Mapping[str, str] = field(default_factory=dict)
    pool: str | None = None
    seq: int = 0
    user: str = ""
    checkpointed: float | None = None  # when the job last reported a complete checkpoint; None: never
    # Seconds the job may run once started (None: no limit, it never ends as far as planning knows), and
    # how long it is expected to run, for start estimates only (None: to its limit).
    time_limit: float | None = None
    predicted_runtime: float | None = None

    def __init__(self, id: str, project: str, request: TaskRequest, priority: int = 50, tasks: int = 1,
                 min_tasks: int | None = None, submitted: float = 0.0, started: float | None = None,
                 placements: tuple[TaskPlacement | None, ...] = (),
                 node_selector: Mapping[str, str] | None = None, pool: str | None = None, seq: int = 0,
                 user: str = "", checkpointed: float | None = None, time_limit: float | None = None,
                 predicted_runtime: float | None = None) -> None:
        object.__setattr__(self, "id", id)
        object.__setattr__(self, "project", project)
        object.__setattr__(self, "request", request)
        object.__setattr__(self, "priority", priority)
        object.__setattr__(self, "tasks", tasks)
        object.__setattr__(self, "min_tasks", min_tasks)
        object.__setattr__(self, "submitted", submitted)
        object.__setattr__(self, "started", started)
        object.__setattr__(self, "placements", placements)
        object.__setattr__(self, "node_selector", {} if node_selector is None else node_selector)
        object.__setattr__(self, "pool", pool)
        object.__setattr__(self, "seq", seq)
        object.__setattr__(self, "user", user)
        object.__setattr__(self, "checkpointed", checkpointed)
        object.__setattr__(self, "time_limit", time_limit)
        object.__setattr__(self, "predicted_runtime", predicted_runtime)

    @property
    def gang_minimum(self) -> int:
        """The fewest tasks the job runs with: ``min_tasks``, or all of them."""
        return self.tasks if self.min_tasks is None else self.min_tasks

    @property
    def preemptible(self) -> bool:
        """Jobs below priority 100 may be evicted; 100 and above never are."""
        return self.priority < NON_PREEMPTIBLE_PRIORITY

    def task_placement(self, index: int) -> TaskPlacement | None:
        """The placement of task ``index``, None when that task is pending."""
        return self.placements[index] if index < len(self.placements) else None

    @property
    def running_tasks(self) -> int:
        """How many tasks of the job hold a placement."""
        return sum(1 for p in self.placements if p is not None)

    @property
    def is_running(self) -> bool:
        """True when at least one task holds a placement."""
        for placement in self.placements:  # a plain loop: a generator costs more than most jobs' tasks
            if placement is not None:
                return True
        return False


@dataclass(frozen=True, slots=True)
class Snapshot:
    """The cluster at one instant: the scheduler's whole input besides the policy.

    ``usage`` is the decayed GPU-seconds charged so far, keyed by (level,
    pool, name) with level "department", "project" or "user" (a user's name
    is "<project>/<user>"); the fair-share history and the user order read it.
    """

    nodes: tuple[NodeSpec, ...]
    jobs: tuple[JobSpec, ...]
    now: float
    usage: Mapping[tuple[str, str, str], float] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Bind:
    """Start task ``task`` of job ``job`` at ``placement``."""

    job: str
    task: int
    placement: TaskPlacement

    def __init__(self, job: str, task: int, placement: TaskPlacement) -> None:
        object.__setattr__(self, "job", job)
        object.__setattr__(self, "task", task)
        object.__setattr__(self, "placement", placement)


@dataclass(frozen=True, slots=True)
class OverLevel:
    """A queue a reclaim took from: over its fair share (``fair``) or only its quota in ``resource``,
    holding ``held`` against ``level`` (that fair share or quota) before the eviction."""

    kind: str
    name: str
    resource: str
    held: float
    level: float
    fair: bool

    def __init__(self, kind: str, name: str, resource: str, held: float, level: float, fair: bool) -> None:
        object.__setattr__(self, "kind", kind)
        object.__setattr__(self, "name", name)
        object.__setattr__(self, "resource", resource)
        object.__setattr__(self, "held", held)
        object.__setattr__(self, "level", level)
        object.__setattr__(self, "fair", fair)


@dataclass(frozen=True, slots=True)
class Evicted:
    """Why tasks were evicted, as data: the rule and what it compared (words are made by readers).

    ``preempt``: job ``for_job`` (``priority``) of ``project`` outranks ``victim`` (``victim_priority``).
    ``reclaim``: the victim's queues ``over`` their levels; ``project`` of ``for_job`` then holds
    ``after`` of ``resource`` against its ``fair_share``. ``consolidate``: moved to make room on ``node``.
    """

    rule: str
    for_job: str
    project: str = ""
    priority: int = 0
    victim: str = ""
    victim_priority: int = 0
    over: tuple[OverLevel, ...] = ()
    resource: str = ""
    after: float = 0.0
    fair_share: float = 0.0
    node: str = ""

    def __init__(self, rule: str, for_job: str, project: str = "", priority: int = 0, victim: str = "",
                 victim_priority: int = 0, over: tuple[OverLevel, ...] = (), resource: str = "",
                 after: float = 0.0, fair_share: float = 0.0, node: str = "") -> None:
        object.__setattr__(self, "rule", rule)
        object.__setattr__(self, "for_job", for_job)
        object.__setattr__(self, "project", project)
        object.__setattr__(self, "priority", priority)
        object.__setattr__(self, "victim", victim)
        object.__setattr__(self, "victim_priority", victim_priority)
        object.__setattr__(self, "over", over)
        object.__setattr__(self, "resource", resource)
        object.__setattr__(self, "after", after)
        object.__setattr__(self, "fair_share", fair_share)
        object.__setattr__(self, "node", node)


@dataclass(frozen=True, slots=True)
class Eviction:
    """Stop tasks of a job (or move them, when ``moved``) and why (``why``: data, see ``Evicted``)."""

    job: str
    tasks: tuple[int, ...]
    rule: str
    why: Evicted | None
    for_job: str | None = None
    moved: bool = False

    def __init__(self, job: str, tasks: tuple[int, ...], rule: str, why: Evicted | None, for_job: str | None = None,
                 moved: bool = False) -> None:
        object.__setattr__(self, "job", job)
        object.__setattr__(self, "tasks", tasks)
        object.__setattr__(self, "rule", rule)
        object.__setattr__(self, "why", why)
        object.__setattr__(self, "for_job", for_job)
        object.__setattr__(self, "moved", moved)


@dataclass(frozen=True, slots=True)
class Blocker:
    """One reason a job waits, as data: the rule and the numbers it compared.

    Placement rules: ``no_nodes``, ``constraint`` (``selector``), ``node_size``
    (one task of ``request`` fits no node), ``shortage`` (``pool`` has ``free``
    of ``resource`` and the tasks that must start together need ``need``),
    ``gang`` (``tasks`` tasks of ``request`` at once: ``free`` GPUs free, but
    only ``nodes_now`` nodes could hold one task now), ``fragmented`` (``free``
    GPUs free, no node holds one task). Queue rules, of queue ``level``
    ``name``: ``limit`` (holds ``held`` of its limit ``bound``), ``quota``
    (its non-preemptible jobs hold ``held`` of quota ``bound``), ``no_over_quota``
    (holds ``held`` of quota ``bound``, may not go over), ``preempt_share``
    (preempting cannot keep it within fair share ``bound`` in the resources
    ``over``: it holds ``held``, the job needs ``need``), ``preempt_over``
    (preempting would take it to ``held`` of ``resource``, over fair share
    ``bound``). Others: ``unknown_project`` (``name``), ``not_considered``,
    ``evicted`` (``evicted``). Limits of the policy: ``running_jobs`` (``level``
    "project" ``name`` a project, "user" a user over all projects, or "member"
    ``name`` "<project>/<user>": runs ``jobs``, at most ``most``), ``user_gpus``
    (``level`` "user" or "member": holds ``held`` of ``bound``, needs ``need``).
    ``runs``, when set, is how many of the job's
    ``of_tasks`` tasks run: the rule is then why the others wait.
    """

    rule: str
    pool: str = ""
    level: str = ""
    name: str = ""
    resource: str = ""
    free: float = 0.0
    need: Resources = ZERO
    held: Resources = ZERO
    bound: Resources = ZERO
    over: tuple[str, ...] = ()
    tasks: int = 0
    request: TaskRequest | None = None
    nodes_now: int = -1
    selector: tuple[tuple[str, str], ...] = ()
    evicted: Evicted | None = None
    runs: int = 0
    of_tasks: int = 0
    jobs: int = 0
    most: int = 0

    def __init__(self, rule: str, pool: str = "", level: str = "", name: str = "", resource: str = "",
                 free: float = 0.0, need: Resources = ZERO, held: Resources = ZERO, bound: Resources = ZERO,
                 over: tuple[str, ...] = (), tasks: int = 0, request: TaskRequest | None = None,
                 nodes_now: int = -1, selector: tuple[tuple[str, str], ...] = (), evicted: Evicted | None = None,
                 runs: int = 0, of_tasks: int = 0, jobs: int = 0, most: int = 0) -> None:
        object.__setattr__(self, "rule", rule)
        object.__setattr__(self, "pool", pool)
        object.__setattr__(self, "level", level)
        object.__setattr__(self, "name", name)
        object.__setattr__(self, "resource", resource)
        object.__setattr__(self, "free", free)
        object.__setattr__(self, "need", need)
        object.__setattr__(self, "held", held)
        object.__setattr__(self, "bound", bound)
        object.__setattr__(self, "over", over)
        object.__setattr__(self, "tasks", tasks)
        object.__setattr__(self, "request", request)
        object.__setattr__(self, "nodes_now", nodes_now)
        object.__setattr__(self, "selector", selector)
        object.__setattr__(self, "evicted", evicted)
        object.__setattr__(self, "runs", runs)
        object.__setattr__(self, "of_tasks", of_tasks)
        object.__setattr__(self, "jobs", jobs)
        object.__setattr__(self, "most", most)


@dataclass(frozen=True, slots=True)
class Waiting:
    """Why a job waits after a cycle: its ``blocker`` (None: only its queue's standing) and its queue as
    the cycle left it (``queue``; None for a job outside any queue, or evicted this cycle)."""

    blocker: Blocker | None
    queue: QueueReport | None = None

    def __init__(self, blocker: Blocker | None, queue: QueueReport | None = None) -> None:
        object.__setattr__(self, "blocker", blocker)
        object.__setattr__(self, "queue", queue)


@dataclass(frozen=True, slots=True)
class QueueReport:
    """One queue (a project or department in one pool) as the last cycle saw it."""

    name: str
    kind: str
    pool: str
    department: str | None
    quota: Resources
    fair_share: Resources
    allocated: Resources
    demand: Resources
    fixed: Resources = ZERO  # what its non-preemptible jobs hold (they run only within quota)

    def __init__(self, name: str, kind: str, pool: str, department: str | None, quota: Resources, fair_share: Resources,
                 allocated: Resources, demand: Resources, fixed: Resources = ZERO) -> None:
        object.__setattr__(self, "name", name)
        object.__setattr__(self, "kind", kind)
        object.__setattr__(self, "pool", pool)
        object.__setattr__(self, "department", department)
        object.__setattr__(self, "quota", quota)
        object.__setattr__(self, "fair_share", fair_share)
        object.__setattr__(self, "allocated", allocated)
        object.__setattr__(self, "demand", demand)
        object.__setattr__(self, "fixed", fixed)


@dataclass(frozen=True, slots=True)
class Reservation:
    """A pending job's planned start: ``start`` (the earliest time the room it needs will be free,
    from running jobs' time limits) on ``nodes``. ``holds``: the room is kept from later jobs that
    would still run at ``start`` (only a pool's first jobs in queue order hold theirs); otherwise
    ``start`` is an estimate only. ``estimate``: the start expected from predicted run times, at
    most ``start``."""

    job: str
    pool: str
    start: float
    nodes: tuple[str, ...]
    holds: bool
    estimate: float


@dataclass(frozen=True, slots=True)
class Plan:
    """What one scheduling cycle decided: binds, evictions and why each pending job waits (``pending``:
    data, made when read; ``gpud.reasons`` words it)."""

    binds: tuple[Bind, ...]
    evictions: tuple[Eviction, ...]
    pending: Mapping[str, Waiting]
    queues: tuple[QueueReport, ...]
    # The planned start of the pending jobs the cycle planned for, by job id (see ``Reservation``).
    reservations: Mapping[str, Reservation] = field(default_factory=dict)
