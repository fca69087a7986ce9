"""Queues (a project or department in one node pool): allocation, demand and fair share."""

from __future__ import annotations

from collections import defaultdict
from typing import TYPE_CHECKING, Final, Iterable, Mapping

from gpud.core.fairshare import INF, Claim, divide
from gpud.core.history import history_factors
from gpud.model import EPS, RESOURCES, ZERO, Resources
from gpud.policy import Policy, QueueSettings

if TYPE_CHECKING:
    from gpud.core.limits import LimitBook

UNLIMITED: Final = Resources(INF, INF, INF)


class QueueState:
    """One queue during a cycle: its settings, what it holds now and what it deserves."""

    __slots__ = ("name", "kind", "pool", "parent", "settings", "quota", "limit", "fair_share",
                 "demand", "alloc_gpu", "alloc_cpu", "alloc_mem", "fixed_gpu", "fixed_cpu", "fixed_mem",
                 "declared", "over_quota_priority",
                 "implicit", "children", "quota_bound", "bounded", "changes", "_allocated", "_allocated_at", "book")

    def __init__(self, name: str, kind: str, pool: str, settings: QueueSettings, declared: int,
                 parent: QueueState | None = None, implicit: bool = False) -> None:
        self.name = name
        self.kind = kind
        self.pool = pool
        self.parent = parent
        self.settings = settings
        self.quota = settings.quota_in(pool)
        self.quota_bound = _bound(self.quota)
        self.limit = settings.limit_in(pool) or UNLIMITED
        self.fair_share = Resources()
        self.demand = Resources()
        self.alloc_gpu = self.alloc_cpu = self.alloc_mem = 0.0
        self.fixed_gpu = self.fixed_cpu = self.fixed_mem = 0.0
        self.declared = declared
        self.over_quota_priority = settings.over_quota_priority
        self.implicit = implicit
        # A hard limit, or no going over quota: what refuses a job here besides its own quota.
        self.bounded = not implicit and (self.limit != UNLIMITED or not settings.over_quota)
        self.children: list[QueueState] = []
        self.changes = 0  # binds and releases here and below: what is derived from them holds until it moves
        self._allocated = ZERO  # ``allocated`` as made when ``changes`` was ``_allocated_at``
        self._allocated_at = 0
        self.book: LimitBook | None = None  # the users' and projects' holdings, when the policy limits them

    @property
    def allocated(self) -> Resources:
        """What the queue's running tasks hold now."""
        if self._allocated_at != self.changes:
            self._allocated = Resources(self.alloc_gpu, self.alloc_cpu, self.alloc_mem)
            self._allocated_at = self.changes
        return self._allocated

    def charge(self, gpu: float, cpu: float, memory: float, preemptible: bool = True) -> None:
        """Add an allocation (negative amounts remove one) here and in the parent queue.

        Allocations of non-preemptible jobs are also counted apart: those
        jobs must fit the quota on their own.
        """
        queue: QueueState | None = self
        while queue is not None:
            queue.changes += 1
            queue.alloc_gpu += gpu
            queue.alloc_cpu += cpu
            queue.alloc_mem += memory
            if not preemptible:
                queue.fixed_gpu += gpu
                queue.fixed_cpu += cpu
                queue.fixed_mem += memory
            queue = queue.parent

    @property
    def fixed(self) -> Resources:
        """What the queue's running non-preemptible jobs hold now."""
        return Resources(self.fixed_gpu, self.fixed_cpu, self.fixed_mem)

    def fits_quota_fixed(self, need: Resources) -> bool:
        """True when the queue's non-preemptible jobs plus ``need`` stay within its quota."""
        bound = self.quota_bound
        return self.implicit or not (
            (need.gpu > EPS and self.fixed_gpu + need.gpu > bound.gpu + EPS)
            or (need.cpu > EPS and self.fixed_cpu + need.cpu > bound.cpu + EPS)
            or (need.memory > EPS and self.fixed_mem + need.memory > bound.memory + EPS))

    def _exceeds(self, level: Resources, need: Resources) -> bool:
        return ((need.gpu > EPS and self.alloc_gpu + need.gpu > level.gpu + EPS)
                or (need.cpu > EPS and self.alloc_cpu + need.cpu > level.cpu + EPS)
                or (need.memory > EPS and self.alloc_mem + need.memory > level.memory + EPS))

    def excess(self, level: Resources, need: Resources) -> list[str]:
        """The resources in which the queue would hold more than ``level`` after taking ``need``."""
        return [resource for resource, amount, held, bound in (
            ("gpu", need.gpu, self.alloc_gpu, level.gpu), ("cpu", need.cpu, self.alloc_cpu, level.cpu),
            ("memory", need.memory, self.alloc_mem, level.memory)) if amount > EPS and held + amount > bound + EPS]

    def fixed_excess(self, need: Resources) -> list[str]:
        """The resources in which the queue's non-preemptible jobs plus ``need`` would exceed its quota."""
        if self.implicit:
            return []
        bound = self.quota_bound
        return [resource for resource, amount, held, limit in (
            ("gpu", need.gpu, self.fixed_gpu, bound.gpu), ("cpu", need.cpu, self.fixed_cpu, bound.cpu),
            ("memory", need.memory, self.fixed_mem, bound.memory)) if amount > EPS and held + amount > limit + EPS]

    def fits_fair_share(self, need: Resources) -> bool:
        """True when the queue stays within its fair share after taking ``need``."""
        return not self._exceeds(self.fair_share, need)

    def fits_quota(self, need: Resources) -> bool:
        """True when the queue stays within its quota after taking ``need`` (an implicit department always does)."""
        return self.implicit or not self._exceeds(self.quota_bound, need)

    def fits_limit(self, need: Resources) -> bool:
        """True when the queue stays within its hard limit after taking ``need``."""
        return not self._exceeds(self.limit, need)

    def over(self, level: Resources, held: Resources) -> bool:
        """True when the queue holds more than ``level`` in some resource that ``held`` uses."""
        return ((held.gpu > EPS and self.alloc_gpu > level.gpu + EPS)
                or (held.cpu > EPS and self.alloc_cpu > level.cpu + EPS)
                or (held.memory > EPS and self.alloc_mem > level.memory + EPS))

    def dominant_share(self, need: Resources) -> float:
        """max over resources of (allocated + need) / max(quota, fair share): how served the queue would be."""
        quota, share = self.quota, self.fair_share
        gpu = _served(self.alloc_gpu + need.gpu, quota.gpu, share.gpu)
        cpu = _served(self.alloc_cpu + need.cpu, quota.cpu, share.cpu)
        mem = _served(self.alloc_mem + need.memory, quota.memory, share.memory)
        most = gpu if gpu >= cpu else cpu  # max(), spelt out: asked for every queue's key, many times a cycle
        return most if most >= mem else mem

    def describe(self, resource: str = "gpu") -> str:
        """A short account such as ``project vision: 6/4 GPUs (fair share 5.5)``."""
        unit = {"gpu": "GPUs", "cpu": "CPUs", "memory": "GiB memory"}[resource]
        return (f"{self.kind} {self.name}: {format_amount(self.allocated.get(resource))}/"
                f"{format_amount(self.quota.get(resource))} {unit} of quota (fair share "
                f"{format_amount(self.fair_share.get(resource))})")

    def __repr__(self) -> str:
        return f"QueueState({self.kind} {self.name} in {self.pool})"


def _served(after: float, quota: float, share: float) -> float:
    """``after`` over the larger of ``quota`` and ``share``; 0 when nothing is held, infinite over nothing."""
    if after <= EPS:
        return 0.0
    base = quota if quota > share else share
    return after / base if base > EPS else INF


def _bound(quota: Resources) -> Resources:
    """The amounts a quota enforces: GPUs always; CPUs and memory only where a quota is set."""
    return Resources(quota.gpu, quota.cpu or INF, quota.memory or INF)


def format_amount(value: float) -> str:
    """A quantity for people: whole numbers plain, fractions to two decimals, inf as unlimited."""
    if value == INF:
        return "unlimited"
    return f"{value:.2f}".rstrip("0").rstrip(".") if value != int(value) else str(int(value))


UNITS = {"gpu": "GPUs", "cpu": "CPUs", "memory": "GiB memory"}
UNIT = {"gpu": "GPU", "cpu": "CPU", "memory": "GiB memory"}


def amount_text(held: float, level: Resources, resource: str) -> str:
    """``held`` against ``level`` in one resource, for people: "12/11 CPUs"."""
    return f"{format_amount(held)}/{format_amount(level.get(resource))} {UNITS[resource]}"


def build_queues(policy: Policy, pools: Iterable[str]) -> dict[tuple[str, str], QueueState]:
    """Create the project and department queues of every pool, keyed by (name, pool).

    Department queues are keyed by ("dept:" + name, pool).
    """
    queues: dict[tuple[str, str], QueueState] = {}
    for pool in pools:
        depts: dict[str, QueueState] = {}
        for i, dept in enumerate(policy.departments.values()):
            queue = QueueState(dept.name, "department", pool, dept, i, implicit=dept.implicit)
            depts[dept.name] = queue
            queues[("dept:" + dept.name, pool)] = queue
        for i, project in enumerate(policy.projects.values()):
            parent = depts[project.department]
            queue = QueueState(project.name, "project", pool, project, i, parent=parent)
            parent.children.append(queue)
            queues[(project.name, pool)] = queue
        for dept_queue in depts.values():
            if dept_queue.implicit:
                dept_queue.quota = sum((c.quota for c in dept_queue.children), Resources())
                dept_queue.quota_bound = _bound(dept_queue.quota)
    return queues


def compute_fair_shares(policy: Policy, queues: dict[tuple[str, str], QueueState],
                        capacity: dict[str, Resources], demand: dict[tuple[str, str], Resources],
                        usage: Mapping[tuple[str, str, str], float] | None = None) -> None:
    """Set demand and fair share on every queue, per pool and per resource, departments first.

    ``demand`` maps (project, pool) to what the project's jobs in that pool
    ask for (running plus pending). ``usage`` (decayed GPU-seconds by
    (level, pool, name)), when the policy's fair-share history is on, scales
    each queue's over-quota weight against its peers' (gpud.core.history).
    """
    if not policy.fair_share.uses_history:
        usage = None
    by_pool: dict[str, list[QueueState]] = defaultdict(list)
    for (key, pool), queue in queues.items():
        if queue.kind == "department":
            by_pool[pool].append(queue)
    for pool, depts in by_pool.items():
        for dept in depts:
            gpu = cpu = mem = 0.0
            for project in dept.children:
                asked = project.demand = demand.get((project.name, pool), ZERO)
                gpu, cpu, mem = gpu + asked.gpu, cpu + asked.cpu, mem + asked.memory
            dept.demand = Resources(gpu, cpu, mem)
        dept_shares = _divide_level(policy, capacity[pool], depts, scale_quotas=False,
                                    used=_used(usage, "department", pool, depts))
        for dept, share in zip(depts, dept_shares):
            dept.fair_share = share
            shares = _divide_level(policy, share, dept.children, scale_quotas=True, pool=capacity[pool],
                                   used=_used(usage, "project", pool, dept.children))
            for project, project_share in zip(dept.children, shares):
                project.fair_share = project_share


def _cap(queue: QueueState, resource: str) -> float:
    if queue.children:
        cap = sum(_cap(c, resource) for c in queue.children)
    else:
        cap = queue.demand.get(resource)
    cap = min(cap, queue.limit.get(resource))
    if not queue.settings.over_quota and not queue.implicit:
        cap = min(cap, queue.quota_bound.get(resource))
    return cap


def _used(usage: Mapping[tuple[str, str, str], float] | None, level: str, pool: str,
          members: list[QueueState]) -> list[float] | None:
    """Each member's decayed usage in ``pool``, or None when history is off."""
    if usage is None:
        return None
    return [usage.get((level, pool, q.name), 0.0) for q in members]


def _divide_level(policy: Policy, capacity: Resources, members: list[QueueState],
                  scale_quotas: bool, pool: Resources | None = None,
                  used: list[float] | None = None) -> list[Resources]:
    """Fair shares of ``members``; with weights off the surplus goes by quota (equally if none has one).

    ``used``, each member's decayed usage, scales the weights (``history_factors``).
    """
    per_resource = []
    for r in RESOURCES:
        by_quota = not policy.over_quota_weights and any(q.quota.get(r) > 0 for q in members)
        weights = [q.quota.get(r) if by_quota else
                   (q.settings.over_quota_weight if policy.over_quota_weights else 1.0) for q in members]
        factors = history_factors(weights, used, policy.fair_share.strength) if used is not None else None
        if factors is not None:
            weights = [w * f for w, f in zip(weights, factors)]
        claims = [Claim(quota=q.quota.get(r), weight=w,
                        priority=q.over_quota_priority, cap=_cap(q, r)) for q, w in zip(members, weights)]
        per_resource.append(divide(capacity.get(r), claims, scale_quotas, pool.get(r) if pool is not None else INF))
    return [Resources(g, c, m) for g, c, m in zip(*per_resource)]
