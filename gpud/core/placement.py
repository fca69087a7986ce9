"""Finding nodes and GPUs for a job's tasks, and saying why none were found."""

from __future__ import annotations

from typing import Final, Iterable, Mapping

from gpud.core.hooks import has_implementations
from gpud.core.memo import Memo
from gpud.core.nodes import NodeIndex, NodeState
from gpud.core.blockers import CONSTRAINT, FRAGMENTED_RULE, GANG, NO_NODES, NODE_SIZE, SHORTAGE
from gpud.core.state import ClusterState, Statement
from gpud.model import EPS, Blocker, JobSpec, Resources, TaskPlacement, TaskRequest
from gpud.policy import NodePool


# The nodes released since a request last found no room are looked at one by one while they are at most one
# in this many of its pool's nodes (or one node); past that, the pool's index is searched again. A search costs
# about what looking at a third of the nodes does (1,000 nodes, compiled), and a look that finds a node that
# could hold the task ends in a search anyway: in a fresh cycle that evicts thousands, the nodes released
# since a request's last search are most of the pool.
RELEASED_LOOKED_AT: Final = 8


class Placer:
    """Places tasks with the pool's placement strategies (plugins), through a statement."""

    def __init__(self, state: ClusterState) -> None:
        self.state = state
        hook = state.hook
        self._policies = state.policies
        self._filter = hook.gpud_filter_node if has_implementations(hook.gpud_filter_node) else None
        self.filters = self._filter is not None  # whether filter plugins may refuse a node (``allows``)
        # By shape number (``ShapeIndex``): True when a search found no room, stamped with the releases
        # then (``ClusterState.releases``); checked against the nodes released since, not searched again.
        self._no_room: Memo[int, bool] = Memo()
        self._pools: dict[str, NodePool] = {}

    def _pool(self, name: str) -> NodePool:
        """The placement settings of pool ``name`` (the policy makes them anew for pools it does not list)."""
        found = self._pools.get(name)
        if found is None:
            found = self._pools[name] = self.state.policy.pool(name)
        return found

    def find(self, job: JobSpec, exclude: frozenset[str] = frozenset()) -> TaskPlacement | None:
        """The best free placement for one more task of ``job``, or None when no node fits.

        A request that found no room is not searched again until some
        resource has been released (free capacity only shrinks otherwise),
        and then only if a node where something was released could hold it,
        or if so many were that looking at each costs more than a search
        (``RELEASED_LOOKED_AT``).
        """
        state = self.state
        key = -1
        if not exclude and self._filter is None:
            # Jobs of one shape ask the same of a node (request, pool, selector): they find room alike.
            key = state.shapes.of(job)
            searched = self._no_room.stamp_of(key)
            if isinstance(searched, int):
                if searched == state.releases or not self._room_on_released(job, searched):
                    self._no_room.put(key, state.releases, True)
                    return None
        found = self._search(job, exclude)
        if found is None and key >= 0:
            self._no_room.put(key, state.releases, True)
        return found

    def _room_on_released(self, job: JobSpec, since: int) -> bool:
        """Whether some node where something was released after ``since`` (``ClusterState.releases``)
        might now hold one task of ``job``; True when that is not known, or when too many of the pool's
        nodes were released to look at each (``RELEASED_LOOKED_AT``). Every other node of the pool has only
        less room than when the job last found none."""
        pool = self.state.pool_of(job)
        index = self.state.indexes.get(pool)
        most = max(1, len(index.nodes) // RELEASED_LOOKED_AT) if index is not None else 0
        released = self.state.released_since(since, most)
        if released is None:
            return True
        request, selector = job.request, job.node_selector
        nodes = self.state.nodes
        for name in released:
            node = nodes[name]
            if (node.pool == pool and node.spec.schedulable and node.holds_host_resources(request)
                    and (not selector or node.matches(selector))
                    and node.pick_gpus(request, range(node.gpus)) is not None):
                return True
        return False

    def _search(self, job: JobSpec, exclude: frozenset[str]) -> TaskPlacement | None:
        state = self.state
        pool = state.pool_of(job)
        index = state.indexes.get(pool)
        if index is None or not index.nodes:
            return None
        request = job.request
        if (request.cpus > index.free_cpu + EPS or request.memory_gib > index.free_mem + EPS
                or (request.uses_gpu and index.free_gpu < EPS)
                or (request.whole_gpus and request.whole_gpus > index.free_gpu + EPS)):
            return None
        settings = self._pool(pool)
        strategy = settings.placement if request.uses_gpu else settings.cpu_placement
        candidates = self._policies.strategy(strategy).candidates(strategy, request, index)
        if candidates is None:
            return None
        selector = job.node_selector
        for node in candidates:
            if selector and not node.matches(selector):
                continue
            if exclude and node.name in exclude:
                continue
            if not node.holds_host_resources(request):
                continue
            if self._filter is not None and any(self._filter(job=job, node=node)):
                continue
            placement = self._pick(job, node, settings.gpu_placement)
            if placement is not None:
                return placement
        return None

    def _pick(self, job: JobSpec, node: NodeState, gpu_strategy: str) -> TaskPlacement | None:
        request = job.request
        if not request.uses_gpu:
            return node.pick_gpus(request, [])
        order = self._policies.strategy(gpu_strategy).gpu_order(gpu_strategy, request, node)
        if order is None:  # no plugin orders GPUs for this strategy: lowest index first
            order = range(node.gpus)
        return node.pick_gpus(request, order)

    def fit_on(self, job: JobSpec, node: NodeState) -> TaskPlacement | None:
        """A placement for one task of ``job`` on this very node (GPUs in the pool's order), or None
        (as well where a filter plugin refuses the node)."""
        if not node.holds_host_resources(job.request):
            return None
        # A node the filter plugins refuse stays refused when eviction made room on it.
        if not self.allows(job, node):
            return None
        return self._pick(job, node, self._pool(node.pool).gpu_placement)

    def allows(self, job: JobSpec, node: NodeState) -> bool:
        """False when a filter plugin (``gpud_filter_node``) refuses the node for the job."""
        return self._filter is None or not any(self._filter(job=job, node=node))

    def place(self, stmt: Statement, job: JobSpec, tasks: list[int], minimum: int,
              exclude: frozenset[str] = frozenset()) -> int:
        """Place as many of ``tasks`` as fit, at least ``minimum``, or none at all.

        Returns how many were placed; on failure everything this call placed
        is rolled back and 0 is returned (0 is also success when minimum is 0
        and nothing fitted).
        """
        mark = stmt.checkpoint()
        placed = 0
        for task in tasks:
            placement = self.find(job, exclude)
            if placement is None:
                break
            stmt.bind(job, task, placement)
            placed += 1
        if placed < minimum:
            stmt.rollback(mark)
            return 0
        return placed

    def restore(self, stmt: Statement, job: JobSpec, task: int, placement: TaskPlacement) -> bool:
        """Put a task back on the very GPUs it had, if they are still free."""
        node = self.state.nodes[placement.node]
        if not node.holds_host_resources(job.request):
            return False
        if any(node.free_share[i] < placement.gpu_share - EPS for i in placement.gpu_index):
            return False
        stmt.bind(job, task, placement)
        return True


def largest_fit(node: NodeState, job: JobSpec) -> bool:
    """True when the task would fit on ``node`` if the node were empty."""
    request = job.request
    spec = node.spec
    if request.cpus > spec.cpus + EPS or request.memory_gib > spec.memory_gib + EPS:
        return False
    if request.gpu_memory_gib is not None:
        return spec.gpus > 0 and request.gpu_memory_gib <= spec.gpu_memory_gib + EPS
    if request.is_shared:
        return spec.gpus > 0
    return request.whole_gpus <= spec.gpus


IMPOSSIBLE: Final = "impossible"
WAITING: Final = "waiting"
FRAGMENTED: Final = "fragmented"


def explain_unplaced(state: ClusterState, job: JobSpec, tasks: int) -> tuple[Blocker, str]:
    """Why ``tasks`` tasks of ``job`` found no room (a blocker, as data), and what kind of wait it is.

    The kind is IMPOSSIBLE for jobs no amount of free capacity would place
    (no such nodes, a task larger than any node), WAITING when the pool lacks
    free capacity, FRAGMENTED when the free capacity is there but scattered.
    """
    pool = state.pool_of(job)
    index = state.indexes.get(pool)
    if index is None or not index.nodes:
        return Blocker(NO_NODES, pool), IMPOSSIBLE
    selector = job.node_selector
    wanted = tuple(sorted(selector.items())) if selector else ()
    matching = matching_nodes(index, selector)
    if not matching:
        return Blocker(CONSTRAINT, pool, selector=wanted), IMPOSSIBLE
    if not any(largest_fit(n, job) for n in matching):
        return Blocker(NODE_SIZE, pool, tasks=tasks, request=job.request, selector=wanted), IMPOSSIBLE
    free_gpu, free_cpu = free_on(index, matching)
    need = state.need(job, tasks)
    short = shortage(pool, need, free_gpu, free_cpu, wanted)
    if short is not None:
        return short, WAITING
    # Free capacity is there, but scattered: how many nodes could hold one task now.
    request = job.request
    return Blocker(GANG if tasks > 1 else FRAGMENTED_RULE, pool, free=free_gpu, need=need, tasks=tasks,
                   request=request, nodes_now=holders_now(index, matching, selector, request),
                   selector=wanted), FRAGMENTED


def holders_now(index: NodeIndex, matching: list[NodeState], selector: Mapping[str, str] | None,
                request: TaskRequest) -> int:
    """How many of ``matching`` (the pool's nodes that match ``selector``) could hold one task of
    ``request`` now."""
    nodes: Iterable[NodeState] = matching
    if request.uses_gpu and not request.is_shared:
        # Only a node with that many whole GPUs free can: those are read from the index's buckets, not
        # the whole pool (a busy pool has few, and a warm cycle asks this for each shape that fails).
        nodes = index.with_free_gpus(request.whole_gpus)
        if selector:
            nodes = [n for n in nodes if n.matches(selector)]
    return sum(1 for n in nodes if n.spec.schedulable and n.holds_host_resources(request)
               and n.pick_gpus(request, range(n.gpus)) is not None)


def shortage(pool: str, need: Resources, free_gpu: float, free_cpu: float,
             selector: tuple[tuple[str, str], ...] = ()) -> Blocker | None:
    """The pool's (or its matching nodes') shortage of GPUs, else of CPUs, for ``need``; None when the
    free totals would hold it."""
    if need.gpu > free_gpu + EPS:
        return Blocker(SHORTAGE, pool, resource="gpu", free=free_gpu, need=need, selector=selector)
    if need.cpu > free_cpu + EPS:
        return Blocker(SHORTAGE, pool, resource="cpu", free=free_cpu, need=need, selector=selector)
    return None


def matching_nodes(index: NodeIndex, selector: Mapping[str, str] | None) -> list[NodeState]:
    """The pool's nodes that carry every label of ``selector`` (all of them, the very list, without one)."""
    return [n for n in index.nodes if n.matches(selector)] if selector else index.nodes


def free_on(index: NodeIndex, nodes: list[NodeState]) -> tuple[float, float]:
    """The free GPUs and CPUs of ``nodes``, some or all of the pool's (``matching_nodes``)."""
    if nodes is index.nodes:
        return index.free_gpu, index.free_cpu
    return sum(sum(n.free_share) for n in nodes), sum(n.free_cpu for n in nodes)


def free_room(state: ClusterState, job: JobSpec) -> tuple[float, float]:
    """The free GPUs and CPUs, now, of the nodes of the job's pool that match its selector."""
    index = state.indexes.get(state.pool_of(job))
    if index is None:
        return 0.0, 0.0
    return free_on(index, matching_nodes(index, job.node_selector))
