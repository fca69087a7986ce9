"""The scheduling policy: departments, projects, node pools, placement and priority classes."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping

from gpud.model import Resources
from gpud.task_defaults import DEFAULT_TASK_PIDS_MAX

DEFAULT_POOL = "default"
DEFAULT_DEPARTMENT = "default"
# The victim orders among jobs of one priority (docs/scheduling.md, "Victims by work lost").
LEAST_LOST_WORK = "least_lost_work"
YOUNGEST_FIRST = "youngest_first"
VICTIM_ORDERS = (LEAST_LOST_WORK, YOUNGEST_FIRST)
DEFAULT_PRIORITY_CLASSES: Mapping[str, int] = {
    "inference": 125,
    "build": 100,
    "interactive-preemptible": 75,
    "train": 50,
}


@dataclass(frozen=True, slots=True)
class Limits:
    """Most GPUs held at once, running jobs and pending jobs (None: no limit), for a user or a project."""

    gpus: float | None = None
    running_jobs: int | None = None
    pending_jobs: int | None = None

    @property
    def any(self) -> bool:
        """True when some limit is set."""
        return self.gpus is not None or self.running_jobs is not None or self.pending_jobs is not None


NO_LIMITS = Limits()


@dataclass(frozen=True, slots=True)
class QueueSettings:
    """Quota and sharing settings of one project or department.

    ``quota`` and ``limit`` map a node pool name to an amount; a pool missing
    from ``quota`` has a zero quota, one missing from ``limit`` has no limit.
    """

    name: str
    quota: Mapping[str, Resources] = field(default_factory=dict)
    limit: Mapping[str, Resources] = field(default_factory=dict)
    over_quota_weight: float = 1.0
    over_quota_priority: int = 0
    over_quota: bool = True

    def quota_in(self, pool: str) -> Resources:
        """The deserved quota in ``pool`` (zero when the policy gives none)."""
        return self.quota.get(pool, Resources())

    def limit_in(self, pool: str) -> Resources | None:
        """The hard cap in ``pool``, or None when unlimited."""
        return self.limit.get(pool)


@dataclass(frozen=True, slots=True)
class Project(QueueSettings):
    """A project: the queue jobs are submitted to, inside one department."""

    department: str = DEFAULT_DEPARTMENT
    users: tuple[str, ...] = ()
    priorities: tuple[str, ...] | None = None
    max_priority: int | None = None
    interactive_class: str | None = None  # the class of its interactive jobs that name none; None: the policy's
    user_limits: Limits = NO_LIMITS  # for each user in the project
    job_limits: Limits = NO_LIMITS  # running and pending jobs of the whole project (its GPUs: ``limit``)


@dataclass(frozen=True, slots=True)
class Department(QueueSettings):
    """A department: a group of projects sharing one quota.

    ``implicit`` marks the department projects fall into when they name none:
    it has no quota of its own and never blocks anything.
    """

    implicit: bool = False


@dataclass(frozen=True, slots=True)
class NodePool:
    """A named set of nodes with its own placement strategies."""

    name: str
    placement: str = "binpack"
    cpu_placement: str = "binpack"
    gpu_placement: str = "binpack"


@dataclass(frozen=True, slots=True)
class PluginSettings:
    """Which plugins the policy switches off, and where site-local plugins live."""

    disable: tuple[str, ...] = ()
    directory: str | None = None


TIME_SLICING_MODES = ("off", "strict", "fair")


@dataclass(frozen=True, slots=True)
class TimeSlicing:
    """How nodes share a GPU among fraction and GPU-memory jobs: the ``[time_slicing]`` table.

    ``mode`` "off" leaves compute to the driver's own round-robin (advisory
    shares); "strict" and "fair" have the node slice the GPU in plans of
    ``lease_ms / precision``. A job holding more GPU memory than its slice
    plus ``memory_tolerance`` is warned, then stopped ``memory_grace_s``
    later when ``memory_enforce`` is on (else only warned).
    """

    mode: str = "off"
    lease_ms: float = 250.0
    precision: float = 0.05
    memory_tolerance: float = 0.05
    memory_enforce: bool = True
    memory_grace_s: float = 10.0

    @property
    def sliced(self) -> bool:
        """True when nodes enforce compute shares (strict or fair)."""
        return self.mode in ("strict", "fair")

    def compute(self, gpus: float, gpu_memory_gib: float | None, request: float | None = None,
                limit: float | None = None) -> tuple[float, float]:
        """A shared job's compute (request, limit), from the reference's table unless the job set its own.

        Fraction jobs: strict gives request = limit = the fraction, fair the
        fraction and 1.0; GPU-memory jobs get 0 and 1.0. A job's own request
        and limit replace these (submission checks they are within bounds);
        in strict mode the limit is the request unless the job set a limit.
        """
        if gpu_memory_gib is not None:
            base_request, base_limit = 0.0, 1.0
        else:
            base_request = gpus
            base_limit = gpus if self.mode == "strict" else 1.0
        req = base_request if request is None else request
        lim = limit if limit is not None else (req if self.mode == "strict" and gpu_memory_gib is None else base_limit)
        return req, max(req, lim)


@dataclass(frozen=True, slots=True)
class FairShare:
    """How past usage weighs in: the ``[fair_share]`` table.

    ``history`` on scales each queue's over-quota weight by how its decayed
    GPU usage compares with its weight (``strength`` 0 ignores the usage);
    a job that started less than ``entry_penalty_s`` ago counts as if
    already charged for that long. ``user_order`` orders a project's jobs of
    equal priority by their users' usage and GPUs held, then by submit time.
    """

    history: bool = False
    strength: float = 1.0
    entry_penalty_s: float = 600.0
    user_order: bool = True

    @property
    def uses_history(self) -> bool:
        """True when past usage changes fair shares."""
        return self.history and self.strength > 0


@dataclass(frozen=True, slots=True)
class Reservations:
    """Reservations and backfill: the ``[reservations]`` table (a node pool may set its own ``jobs``,
    ``window``, ``default_time_limit`` and ``max_time_limit``).

    The first ``jobs`` pending jobs of a pool in queue order that find no room
    each hold the room they need from the earliest time running jobs' time
    limits free it, if that is within ``window_s``: a later job may start
    only where it ends before, or uses room the reservation does not need.
    The next ``estimate_jobs`` get a start estimate without holding room. A
    holding reservation is promised the end of the ``resolution_s`` step (from
    Unix time 0) that holds its earliest start, and takes the start and nodes
    in that step that leave the least GPU time idle while it waits.
    ``jobs`` 0 turns reservations off. A job without a time limit gets
    ``default_time_limit_s`` (None: it has no limit), none above ``max_time_limit_s``.
    """

    jobs: int = 4
    window_s: float = 7 * 86400.0
    estimate_jobs: int = 12
    resolution_s: float = 300.0
    default_time_limit_s: float | None = None
    max_time_limit_s: float | None = None


@dataclass(frozen=True, slots=True)
class Policy:
    """The whole scheduling policy, as read from the policy file."""

    departments: Mapping[str, Department] = field(default_factory=dict)
    projects: Mapping[str, Project] = field(default_factory=dict)
    pools: Mapping[str, NodePool] = field(default_factory=dict)
    default_pool: str = DEFAULT_POOL
    partitions: Mapping[str, str] = field(default_factory=dict)  # a Slurm partition name -> the pool it means
    over_quota_weights: bool = True
    priority_classes: Mapping[str, int] = field(default_factory=lambda: dict(DEFAULT_PRIORITY_CLASSES))
    idle_timeouts: Mapping[str, float] = field(default_factory=dict)  # per class: idle interactive jobs end
    interactive_class: str = "build"  # the class of interactive jobs (gpuctl run, notebook) that name none
    min_runtime_s: float = 300.0
    grace_period_s: float = 30.0
    task_pids_max: int = DEFAULT_TASK_PIDS_MAX  # the most processes and threads one task may have at once
    victim_order: str = LEAST_LOST_WORK  # among victims of one priority: LEAST_LOST_WORK or YOUNGEST_FIRST first
    # With LEAST_LOST_WORK: the most work one consolidation may lose, in hours of the GPUs of the job it makes
    # room for (at least one GPU); moves that would lose more are not made.
    max_move_lost_hours: float = 2.0
    age_weight: float = 0.0  # priority points a pending job gains per hour it waits, in its project's order
    plugins: PluginSettings = field(default_factory=PluginSettings)
    placement: str = "binpack"
    cpu_placement: str = "binpack"
    gpu_placement: str | None = None
    time_slicing: TimeSlicing = field(default_factory=TimeSlicing)
    usage_half_life_s: float = 7 * 86400.0  # decayed usage halves in this time; 0: it never decays
    usage_reset: str = "none"               # none | daily | weekly | monthly: usage starts over at each
    usage_charge_interval_s: float = 30.0   # how often running jobs are charged (and at most what a crash loses)
    fair_share: FairShare = field(default_factory=FairShare)
    user_limits: Limits = NO_LIMITS  # for each user, over all projects: the ``[limits]`` table
    reservations: Reservations = field(default_factory=Reservations)
    pool_reservations: Mapping[str, Reservations] = field(default_factory=dict)  # a node pool's own table
    class_time_limits: Mapping[str, float] = field(default_factory=dict)  # per priority class: default limit

    def reservations_in(self, pool: str) -> Reservations:
        """The reservation settings of pool ``pool``: its own, else the policy's."""
        return self.pool_reservations.get(pool, self.reservations)

    def time_limit_for(self, pool: str, priority_class: str | None, asked: float | None) -> float | None:
        """The time limit a job runs under: ``asked``, else its class's default, else the pool's
        ``default_time_limit``; never above the pool's ``max_time_limit`` (None: no limit)."""
        settings = self.reservations_in(pool)
        limit = asked
        if limit is None and priority_class is not None:
            limit = self.class_time_limits.get(priority_class)
        if limit is None:
            limit = settings.default_time_limit_s
        cap = settings.max_time_limit_s
        if cap is not None and (limit is None or limit > cap):
            limit = cap
        return limit

    @property
    def has_limits(self) -> bool:
        """True when some user or project limits GPUs held, running jobs or pending jobs."""
        return self.user_limits.any or any(p.user_limits.any or p.job_limits.any for p in self.projects.values())

    def pool(self, name: str) -> NodePool:
        """The settings of pool ``name``; pools the policy does not list use the top-level placement."""
        found = self.pools.get(name)
        if found is not None:
            return found
        return NodePool(name, self.placement, self.cpu_placement, self.gpu_placement or self.placement)

    def allowed_priorities(self, project: str) -> tuple[tuple[str, ...], int]:
        """The priority classes a project's users may name, and the highest integer priority they may give.

        A project that lists no ``priorities`` allows every class; one without
        ``max_priority`` allows integers up to its highest allowed class.
        """
        settings = self.projects[project]
        classes = tuple(self.priority_classes) if settings.priorities is None else settings.priorities
        if settings.max_priority is not None:
            return classes, settings.max_priority
        return classes, max((self.priority_classes[name] for name in classes), default=0)

    def default_class(self, project: str, interactive: bool) -> str:
        """The priority class a job of ``project`` that names none gets: the project's or the policy's
        ``interactive_class`` for interactive work, ``train`` for batch work."""
        if not interactive:
            return "train"
        settings = self.projects.get(project)
        chosen = settings.interactive_class if settings is not None else None
        return chosen or self.interactive_class

    def department_of(self, project: str) -> Department:
        """The department a project belongs to."""
        return self.departments[self.projects[project].department]
