"""Mutable per-cycle node state and the per-pool index of nodes by free capacity."""

from __future__ import annotations

import bisect
from typing import Final, Iterable, Iterator, Mapping

from gpud.model import EPS, NodeSpec, Resources, TaskPlacement, TaskRequest
from gpud.core.turns import NO_TURNS, Turns

SHARE_BUCKETS: Final = 100
CPU_CLASSES: Final = 9

# What bin-pack's leftover counts, each resource relative to the pool's largest node: GPUs (whole and
# the free part of shared ones) most, as they are what strands; CPUs and memory less, so nodes with
# host resources to spare stay free for the tasks that need them. Chosen on the Alibaba trace
# (docs/trace.md): GPUs weighed 1-4 against CPUs, memory 0-1.
GPU_WEIGHT: Final = 1.0
CPU_WEIGHT: Final = 1.0 / 3.0
MEMORY_WEIGHT: Final = 0.1

# A bucket's nodes by leftover: (leftover, stamp, node), sorted. The stamp numbers the node's entry
# into its bucket, so among equal leftovers the nodes keep the bucket's own order (the dict's).
FitEntry = tuple[float, int, "NodeState"]


def cpu_class(cpus: float) -> int:
    """Nodes are also grouped by free CPUs in powers of two: class k holds [2**(k-1), 2**k) free CPUs."""
    if cpus < 1:
        return 0
    return min(CPU_CLASSES - 1, int(cpus).bit_length())


def node_kind(spec: NodeSpec) -> tuple:
    """What decides whether a node could ever hold a task: its pool, whether it takes work, its sizes and labels.

    Nodes of one kind answer alike for every request, however busy they are.
    """
    return (spec.pool, spec.schedulable, spec.gpus, spec.gpu_memory_gib, spec.cpus, spec.memory_gib,
            tuple(sorted(spec.labels.items())))


class NodeState:
    """One node's free capacity during a cycle, and the tasks it holds.

    ``kind`` numbers the node's ``node_kind`` among the cluster's nodes.
    """

    __slots__ = ("spec", "name", "pool", "labels", "gpu_memory_gib", "free_share", "free_whole",
                 "free_cpu", "free_mem", "tasks", "_whole_bucket", "_cpu_bucket", "_share_bucket",
                 "_cpu_class", "version", "kind", "_whole_fit", "_cpu_fit", "_whole_stamp", "_cpu_stamp",
                 "_whole_fits", "_cpu_fits")

    def __init__(self, spec: NodeSpec, kind: int = 0) -> None:
        self.spec = spec
        self.kind = kind
        self.name = spec.name
        self.pool = spec.pool
        self.labels: Mapping[str, str] = spec.labels
        self.gpu_memory_gib = spec.gpu_memory_gib
        self.free_share = [1.0] * spec.gpus
        for index in spec.out_of_service:
            self.free_share[index] = 0.0
        self.free_whole = spec.usable_gpus
        self.free_cpu = float(spec.cpus)
        self.free_mem = float(spec.memory_gib)
        self.tasks: dict[tuple[str, int], TaskPlacement] = {}
        self._whole_bucket = -1
        self._cpu_bucket = -1
        self._share_bucket: list[int] = [-1] * spec.gpus
        self._cpu_class = -1
        # Its entries in the index's lists by leftover (``NodeIndex.fit_whole``, ``fit_cpu``) and the lists
        # they are in, once in them; the stamps of its latest entries into its buckets, which those
        # entries carry once the lists are sorted again (``NodeIndex.sort_fits``).
        self._whole_fit: FitEntry | None = None
        self._cpu_fit: FitEntry | None = None
        self._whole_fits: list[FitEntry] | None = None
        self._cpu_fits: list[FitEntry] | None = None
        self._whole_stamp = -1
        self._cpu_stamp = -1
        # Bumped on every take and give_back, so plugins can memoise what they derive from a node.
        self.version = 0

    @property
    def gpus(self) -> int:
        """How many GPUs the node has."""
        return self.spec.gpus

    def matches(self, selector: Mapping[str, str]) -> bool:
        """True when the node carries every label of ``selector``."""
        labels = self.labels
        return all(labels.get(k) == v for k, v in selector.items())

    def holds_host_resources(self, request: TaskRequest) -> bool:
        """True when the node has the CPUs and memory a task asks for free."""
        return request.cpus <= self.free_cpu + EPS and request.memory_gib <= self.free_mem + EPS

    def pick_gpus(self, request: TaskRequest, order: Iterable[int]) -> TaskPlacement | None:
        """Choose GPUs for a task in the given order of preference; None when they are not free."""
        if not request.uses_gpu:
            return TaskPlacement(self.name, (), 0.0)
        if request.is_shared:
            if request.gpu_memory_gib is not None and request.gpu_memory_gib > self.gpu_memory_gib + EPS:
                return None
            share = request.gpu_share_on(self.gpu_memory_gib)
            for i in order:
                if self.free_share[i] >= share - EPS:
                    return TaskPlacement(self.name, (i,), share)
            return None
        count = request.whole_gpus
        chosen = [i for i in order if self.free_share[i] >= 1.0 - EPS][:count]
        if len(chosen) < count:
            return None
        return TaskPlacement(self.name, tuple(sorted(chosen)), 1.0)

    def take(self, key: tuple[str, int], placement: TaskPlacement, request: TaskRequest) -> None:
        """Reserve a placement's GPUs, CPUs and memory for task ``key``."""
        for i in placement.gpu_index:
            before = self.free_share[i]
            after = before - placement.gpu_share
            self.free_share[i] = 0.0 if after < EPS else after
            if before >= 1.0 - EPS:
                self.free_whole -= 1
        self.free_cpu -= request.cpus
        self.free_mem -= request.memory_gib
        self.tasks[key] = placement
        self.version += 1

    def give_back(self, key: tuple[str, int], request: TaskRequest) -> TaskPlacement:
        """Release what task ``key`` held on this node and return its placement."""
        placement = self.tasks.pop(key)
        for i in placement.gpu_index:
            if i in self.spec.out_of_service:
                continue
            after = self.free_share[i] + placement.gpu_share
            if after >= 1.0 - EPS:
                after = 1.0
                self.free_whole += 1
            self.free_share[i] = after
        self.free_cpu += request.cpus
        self.free_mem += request.memory_gib
        self.version += 1
        return placement


def leftover(node: NodeState, index: NodeIndex) -> float:
    """The node's free capacity, weighted (``GPU_WEIGHT``, ``CPU_WEIGHT``, ``MEMORY_WEIGHT``), each
    resource as a share of the largest node of the pool: 0 for a full node, up to the weights' sum.

    A task takes the same from any node that holds it, so ranking nodes by this
    before placement ranks them by what the task would leave free."""
    return (GPU_WEIGHT * sum(node.free_share) / max(index.max_gpus, 1)
            + CPU_WEIGHT * node.free_cpu / max(index.max_cpus, 1)
            + MEMORY_WEIGHT * node.free_mem / max(index.max_memory, 1.0))


def _refit(fits: list[FitEntry], old: FitEntry | None, old_fits: list[FitEntry] | None, entry: FitEntry) -> FitEntry:
    """Put ``entry`` into the sorted list ``fits`` in place of ``old``, which is in ``old_fits`` (None:
    in no list); ``entry``."""
    if old is not None and old_fits is not None:
        del old_fits[bisect.bisect_left(old_fits, old)]
    bisect.insort(fits, entry)
    return entry


def _share_bucket(free: float) -> int:
    if free >= 1.0 - EPS or free < EPS:
        return -1
    return min(SHARE_BUCKETS - 1, int(free * SHARE_BUCKETS + EPS))


class NodeIndex:
    """The nodes of one pool, bucketed by free whole GPUs, free CPUs and free share of shared GPUs.

    Placement strategies walk the buckets in the order they prefer, so finding
    a node costs about the number of buckets, not the number of nodes. The
    iterators are lazy: a caller stops iterating before it changes a node.

    Each bucket by whole GPUs and CPU class, and each by free CPUs, also
    keeps its nodes sorted by leftover (``fit_whole``, ``fit_cpu``), ties in
    the bucket's own order: bin-pack's best fit reads a bucket's best node
    from the front instead of scoring all of them. Those lists are sorted
    when read (``sort_fits``), not at every change: a node placed on and
    released from again and again between two readings (a preemption tried
    and rolled back, a snapshot's running tasks booked one by one) is
    scored and moved once.
    """

    def __init__(self, pool: str, nodes: list[NodeState], turns: Turns = NO_TURNS) -> None:
        self.pool = pool
        self.nodes = nodes
        self.max_gpus = max((n.gpus for n in nodes), default=0)
        self.max_cpus = int(max((n.spec.cpus for n in nodes), default=0))
        self.max_memory = float(max((n.spec.memory_gib for n in nodes), default=0.0))
        self.max_gpu_memory = max((n.gpu_memory_gib for n in nodes if n.gpus), default=0.0)
        self.gpu_memories = sorted({n.gpu_memory_gib for n in nodes if n.gpus})
        self.capacity = Resources(sum(n.spec.usable_gpus for n in nodes), sum(n.spec.cpus for n in nodes),
                                  sum(n.spec.memory_gib for n in nodes))
        self.by_whole: list[list[dict[NodeState, None]]] = [[{} for _ in range(CPU_CLASSES)]
                                                             for _ in range(self.max_gpus + 1)]
        self.by_cpu: list[dict[NodeState, None]] = [{} for _ in range(self.max_cpus + 1)]
        self.by_share: list[list[dict[tuple[NodeState, int], None]]] = [[{} for _ in range(CPU_CLASSES)]
                                                                        for _ in range(SHARE_BUCKETS)]
        self.share_counts = [0] * SHARE_BUCKETS  # GPUs in each row of by_share, so empty rows are passed over
        self.fit_whole: list[list[list[FitEntry]]] = [[[] for _ in range(CPU_CLASSES)]
                                                      for _ in range(self.max_gpus + 1)]
        self.fit_cpu: list[list[FitEntry]] = [[] for _ in range(self.max_cpus + 1)]
        self._stamp = 0  # entries into a bucket so far: the stamp of the next one
        # The nodes changed since the lists by leftover were last sorted (``sort_fits``).
        self._unsorted: dict[NodeState, None] = {}
        self.free_gpu = float(self.capacity.gpu)
        self.free_cpu = float(self.capacity.cpu)
        self.free_mem = float(self.capacity.memory)
        self._turns = turns  # a step per node indexed or sorted (gpud.core.turns)
        for node in nodes:
            turns.step()
            self.update(node)  # the lists by leftover are made when first read

    def smallest_gpu_holding(self, memory_gib: float) -> float | None:
        """The least GPU memory in the pool that can hold a slice of ``memory_gib``, None if none can."""
        for size in self.gpu_memories:
            if size >= memory_gib - EPS:
                return size
        return None

    def update(self, node: NodeState, gpus: tuple[int, ...] | None = None) -> None:
        """Move a node to the buckets that match its free capacity now.

        ``gpus``, when given, are the only GPUs whose free share changed.
        """
        klass = cpu_class(node.free_cpu + EPS)
        old_class = node._cpu_class
        moved_class = klass != old_class
        node._cpu_class = klass
        whole = node.free_whole
        if whole != node._whole_bucket or moved_class:
            if node._whole_bucket >= 0:
                del self.by_whole[node._whole_bucket][old_class][node]
            self.by_whole[whole][klass][node] = None
            node._whole_bucket = whole
            node._whole_stamp = self._stamp
            self._stamp += 1
        cpu = max(0, min(self.max_cpus, int(node.free_cpu + EPS)))
        if cpu != node._cpu_bucket:
            if node._cpu_bucket >= 0:
                del self.by_cpu[node._cpu_bucket][node]
            self.by_cpu[cpu][node] = None
            node._cpu_bucket = cpu
            node._cpu_stamp = self._stamp
            self._stamp += 1
        self._unsorted[node] = None
        shares, buckets = node.free_share, node._share_bucket
        changed = range(len(shares)) if gpus is None or moved_class else gpus if len(gpus) < 2 else sorted(gpus)
        for i in changed:
            bucket = _share_bucket(shares[i])
            old = buckets[i]
            if bucket != old or (moved_class and bucket >= 0):  # a GPU in no bucket stays in none
                if old >= 0:
                    del self.by_share[old][old_class][(node, i)]
                    self.share_counts[old] -= 1
                if bucket >= 0:
                    self.by_share[bucket][klass][(node, i)] = None
                    self.share_counts[bucket] += 1
                buckets[i] = bucket

    def sort_fits(self) -> None:
        """Bring the lists by leftover (``fit_whole``, ``fit_cpu``) up to date: each node of the pool in
        the lists of its buckets, sorted by (leftover now, stamp of its latest entry into the bucket),
        as they would be had each change been sorted in when made.

        Called before the lists are read; costs what changed since the last call.
        """
        unsorted = self._unsorted
        if not unsorted:
            return
        if len(unsorted) * 2 < len(self.nodes):
            for node in unsorted:
                self._turns.step()
                score = leftover(node, self)
                entry = node._whole_fit
                if entry is None or entry[0] != score or entry[1] != node._whole_stamp:
                    fits = self.fit_whole[node._whole_bucket][node._cpu_class]
                    node._whole_fit = _refit(fits, entry, node._whole_fits, (score, node._whole_stamp, node))
                    node._whole_fits = fits
                entry = node._cpu_fit
                if entry is None or entry[0] != score or entry[1] != node._cpu_stamp:
                    fits = self.fit_cpu[node._cpu_bucket]
                    node._cpu_fit = _refit(fits, entry, node._cpu_fits, (score, node._cpu_stamp, node))
                    node._cpu_fits = fits
        else:  # many changed (a snapshot's running tasks booked): every list made again, one sort each
            for row in self.fit_whole:
                for fits in row:
                    fits.clear()
            for fits in self.fit_cpu:
                fits.clear()
            for node in self.nodes:
                self._turns.step()
                score = leftover(node, self)
                fits = node._whole_fits = self.fit_whole[node._whole_bucket][node._cpu_class]
                node._whole_fit = (score, node._whole_stamp, node)
                fits.append(node._whole_fit)
                fits = node._cpu_fits = self.fit_cpu[node._cpu_bucket]
                node._cpu_fit = (score, node._cpu_stamp, node)
                fits.append(node._cpu_fit)
            for row in self.fit_whole:
                for fits in row:
                    fits.sort()
            for fits in self.fit_cpu:
                fits.sort()
        self._unsorted = {}

    def with_free_gpus(self, count: int, most_free_first: bool = False,
                       cpus: float = 0.0) -> Iterator[NodeState]:
        """Nodes with at least ``count`` whole GPUs free: fewest free first, or most free first.

        Nodes with far fewer than ``cpus`` CPUs free are passed over (callers
        still check each node they are given).
        """
        count = max(count, 0)
        if count > self.max_gpus:
            return
        buckets = range(self.max_gpus, count - 1, -1) if most_free_first else range(count, self.max_gpus + 1)
        classes = range(cpu_class(cpus), CPU_CLASSES)
        for k in buckets:
            row = self.by_whole[k]
            for c in classes:
                yield from row[c]

    def with_free_cpus(self, cpus: float, most_free_first: bool = False) -> Iterator[NodeState]:
        """Nodes with at least ``cpus`` CPUs free: fewest free first, or most free first."""
        # Bucket k holds nodes with [k, k + 1) CPUs free: one with at least ``cpus`` free is in bucket
        # int(cpus) or above, whole or not (a node with half a CPU free holds a task asking a quarter).
        low = max(int(cpus), 0)
        if low > self.max_cpus:
            return
        buckets = range(self.max_cpus, low - 1, -1) if most_free_first else range(low, self.max_cpus + 1)
        for k in buckets:
            for node in self.by_cpu[k]:
                if node.free_cpu >= cpus - EPS:
                    yield node

    def shared_gpus(self, share: float, most_free_first: bool = False,
                    cpus: float = 0.0) -> Iterator[tuple[NodeState, int]]:
        """Partly used GPUs with at least ``share`` free, as (node, GPU index): least free first or most."""
        low = max(0, int(share * SHARE_BUCKETS - EPS) if share > 0 else 0)
        low = min(low, SHARE_BUCKETS - 1)
        buckets = range(SHARE_BUCKETS - 1, low - 1, -1) if most_free_first else range(low, SHARE_BUCKETS)
        classes = range(cpu_class(cpus), CPU_CLASSES)
        counts = self.share_counts
        for k in buckets:
            if not counts[k]:
                continue
            row = self.by_share[k]
            for c in classes:
                for node, i in row[c]:
                    if node.free_share[i] >= share - EPS:
                        yield node, i


class FreeOrder:
    """A pool's nodes sorted most free GPU share first (pool order among equals), kept from cycle to cycle.

    Sums are worked out again only for nodes changed since (their
    ``version``), and only once something in the cluster was placed or
    released (``ClusterState.changes``, which counts every change of a node,
    between cycles too).
    """

    __slots__ = ("nodes", "sums", "versions", "ordered", "changes")

    def __init__(self, nodes: list[NodeState], changes: int) -> None:
        self.nodes = nodes
        self.sums = [(-sum(n.free_share), i, n) for i, n in enumerate(nodes)]
        self.versions = [n.version for n in nodes]
        self.ordered = sorted(self.sums)
        self.changes = changes
