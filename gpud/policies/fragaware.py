"""Fragmentation-aware placement: the node and GPU whose leftover can still hold the most of the
typical requests, so free GPUs stay usable instead of being stranded.

A node's fragmentation, for a profile of typical requests (shapes with a
popularity), is the popularity-weighted amount of its free GPU that the shapes
cannot use. Placement picks the node and GPU that raise it least, then the
fullest node. ``fgd`` is the FGD paper's measure (ATC '23: next request only,
CPU and GPU, scores quantised as in its simulator), kept for comparison;
``fragaware`` also counts memory, mixes in the long run (what is left once
as many copies of each shape as the node's GPUs, CPUs and memory allow are
placed), and weighs each shape by how few of the pool's GPUs sit on nodes
large enough for it (``scarcity``), so the only hosts of a large request are
not spent on small ones while other nodes can take them.

The profile is the workload's: a ``FragAware(profile)`` instance registered
after the built-ins answers in their place (the trace replay registers one
built from the trace); the module's own plugin (``PLUGIN``) uses
``DEFAULT_PROFILE``. A ``FragAware`` is a placement strategy object
(gpud.core.strategies.Strategy): the core calls its ``candidates`` and
``gpu_order`` itself, and passes it by for other strategies.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from itertools import chain
from typing import Iterable, Iterator, Mapping, Sequence

from gpud.core.nodes import NodeIndex, NodeState
from gpud.core.strategies import Strategy
from gpud.model import EPS, TaskRequest
from gpud.policies.binpack import smallest_share
from gpud.policies.strategy_hooks import StrategyHooks

NAMES = ("fragaware", "fgd")
MILLI = 1000
CACHE_LIMIT = 200_000
# How much of a shape's loss is judged by the next request alone (FGD's view) rather than by the
# long run; chosen on the Alibaba trace among 0.3, 0.6, 0.7, 0.8 and 1 (docs/trace.md).
NEXT_WEIGHT = 0.8


@dataclass(frozen=True, slots=True)
class Shape:
    """A typical request: GPUs (count, thousandths of each), CPUs in thousandths, memory in MiB."""

    num_gpu: int
    gpu_milli: int
    cpu_milli: int
    mem_mib: int
    selector: tuple[tuple[str, str], ...] = ()


def shape_of(request: TaskRequest, selector: Mapping[str, str] | None = None,
             gpu_memory_gib: float = 0.0) -> Shape:
    """The shape of a task request (a memory slice counted as its share of a GPU of ``gpu_memory_gib``)."""
    if request.is_shared:
        share = request.gpu_share_on(gpu_memory_gib) if request.gpu_memory_gib is not None else request.gpus
        num, milli = 1, round(share * MILLI)
    else:
        num, milli = request.whole_gpus, MILLI if request.whole_gpus else 0
    return Shape(num, milli, round(request.cpus * MILLI), round(request.memory_gib * 1024),
                 tuple(sorted((selector or {}).items())))


# A generic mix for clusters that give none: mostly one-GPU tasks, a third of them fractions, some
# multi-GPU tasks, about 12 CPUs and 48 GiB per GPU.
DEFAULT_PROFILE: tuple[tuple[Shape, float], ...] = (
    (Shape(1, 250, 4000, 16384), 0.08), (Shape(1, 500, 6000, 24576), 0.12), (Shape(1, 800, 4000, 24576), 0.12),
    (Shape(1, 1000, 12000, 49152), 0.5), (Shape(2, 1000, 24000, 98304), 0.06),
    (Shape(4, 1000, 48000, 196608), 0.06), (Shape(8, 1000, 96000, 393216), 0.06),
)

# (free GPU thousandths in descending order, free CPU thousandths, free memory MiB, bit mask of the
# profile's model constraints the node meets)
Signature = tuple[tuple[int, ...], int, int, int]


class FragAware(StrategyHooks, Strategy):
    """The placement strategies ``fragaware`` and ``fgd`` for one profile of typical requests.

    Scores are memoised by node signature (free GPU slivers, CPU, memory), so a
    decision costs a few look-ups per candidate node.
    """

    def __init__(self, profile: Iterable[tuple[Shape, float]] = DEFAULT_PROFILE) -> None:
        super().__init__(NAMES)
        shapes = [(s, float(w)) for s, w in profile if w > 0 and (s.num_gpu or s.gpu_milli)]
        total = sum(w for _, w in shapes) or 1.0
        self.profile = tuple((s, w / total) for s, w in shapes)
        self._selectors = sorted({s.selector for s, _ in self.profile if s.selector})
        self._frag: dict[tuple[Signature, bool, int], float] = {}
        self._delta: dict[tuple, tuple[float, int]] = {}
        self._sig: dict[NodeState, tuple[int, Signature, tuple[int, int]]] = {}
        self._interned: dict[Signature, Signature] = {}
        self._access: dict[NodeState, int] = {}
        # Per-shape weights by the pool's make-up (``scarcity``); scores are memoised under their number.
        self._scarcities: list[tuple[float, ...]] = [tuple(1.0 for _ in self.profile)]
        self._scarcity_of: dict[tuple, int] = {}
        self._pool_scarcity: dict[str, int] = {}

    # --- the fragmentation measure ------------------------------------------------------------

    def _access_mask(self, node: NodeState) -> int:
        mask = self._access.get(node)
        if mask is None:
            if len(self._access) > CACHE_LIMIT:
                self._access.clear()
            mask = 0
            for bit, selector in enumerate(self._selectors):
                if all(node.labels.get(k) == v for k, v in selector):
                    mask |= 1 << bit
            self._access[node] = mask
        return mask

    def signature(self, node: NodeState) -> Signature:
        """The node's free capacity in integer units, the key every score is memoised under."""
        return self._node_entry(node)[1]

    def _node_entry(self, node: NodeState) -> tuple[int, Signature, tuple[int, int]]:
        """(node version, signature, best-fit tie-break) of a node, recomputed only when it changed."""
        cached = self._sig.get(node)
        if cached is not None and cached[0] == node.version:
            return cached
        if len(self._sig) > CACHE_LIMIT:
            self._sig.clear()
        gpus = tuple(sorted((round(f * MILLI) for f in node.free_share), reverse=True))
        cpu = round(node.free_cpu * MILLI)
        sig = (gpus, cpu, round(node.free_mem * 1024), self._access_mask(node))
        # Interned, so equal signatures are one object and hash once per look-up chain.
        sig = self._interned.setdefault(sig, sig)
        entry = (node.version, sig, (sum(gpus), cpu))
        self._sig[node] = entry
        return entry

    def scarcity(self, nodes: Sequence[NodeState]) -> tuple[float, ...]:
        """Per typical shape: the GPUs of ``nodes`` over the GPUs on those of them large enough for one
        copy (GPUs, CPUs, memory, model), so 1 for a shape any node holds and 20 for one that only a
        twentieth of the GPUs can serve; 1 for a shape no node holds (it costs every node alike)."""
        total = sum(n.spec.usable_gpus for n in nodes)
        out = []
        for shape, _ in self.profile:
            hosts = sum(n.spec.usable_gpus for n in nodes if _could_host(n, shape))
            out.append(total / hosts if hosts else 1.0)
        return tuple(out)

    def _scarcity_number(self, index: NodeIndex) -> int:
        """The number of the pool's scarcity weights, computed again only when its nodes change."""
        key = (index.pool, len(index.nodes), index.capacity)
        number = self._scarcity_of.get(key)
        if number is None:
            weights = self.scarcity(index.nodes)
            if weights in self._scarcities:
                number = self._scarcities.index(weights)
            else:
                number = len(self._scarcities)
                self._scarcities.append(weights)
            self._scarcity_of[key] = number
        self._pool_scarcity[index.pool] = number
        return number

    def fragmentation(self, sig: Signature, fgd: bool = False, scarcity: int = 0) -> float:
        """The profile-weighted GPU thousandths of a node that typical requests could not use.

        For each typical shape two views are mixed: the next request's (FGD's:
        all free GPU is lost when the shape does not fit, else the slivers too
        small for it) and the long run's (what is left once as many copies of
        the shape as the GPUs, CPUs and memory allow are placed), which sees
        CPUs or memory running out before the GPUs do. ``fgd`` gives the
        paper's measure alone, without memory. ``scarcity`` numbers the shape
        weights (``scarcity``) that multiply the popularity; 0, all ones.
        """
        key = (sig, fgd, scarcity)
        found = self._frag.get(key)
        if found is not None:
            return found
        if len(self._frag) > CACHE_LIMIT:
            self._frag.clear()
            self._interned.clear()
        gpus, cpu, mem, mask = sig
        total = sum(gpus)
        frag = 0.0
        next_weight = 1.0 if fgd else NEXT_WEIGHT
        scarce = self._scarcities[scarcity]
        for number, (shape, weight) in enumerate(self.profile if total else ()):
            weight *= scarce[number]
            if shape.selector and not mask >> self._selectors.index(shape.selector) & 1:
                frag += weight * total
                continue
            lacks_host = shape.cpu_milli > cpu or (not fgd and shape.mem_mib > mem)
            fits = 0
            slivers = 0
            slots = 0
            for g in gpus:
                if g >= shape.gpu_milli:
                    fits += 1
                    slots += g // shape.gpu_milli
                else:
                    slivers += g
            nxt = total if lacks_host or fits < shape.num_gpu else slivers
            if fgd:
                frag += weight * nxt
                continue
            if shape.gpu_milli == MILLI:
                slots = fits // shape.num_gpu
            if shape.cpu_milli:
                slots = min(slots, cpu // shape.cpu_milli)
            if shape.mem_mib:
                slots = min(slots, mem // shape.mem_mib)
            longrun = total - slots * shape.num_gpu * shape.gpu_milli
            frag += weight * (next_weight * nxt + (1 - next_weight) * longrun)
        self._frag[key] = frag
        return frag

    def _after(self, sig: Signature, shape: Shape, free: int) -> Signature:
        gpus = list(sig[0])
        if not shape.num_gpu:
            pass
        elif shape.gpu_milli < MILLI:
            gpus.remove(free)
            gpus.append(free - shape.gpu_milli)
            gpus.sort(reverse=True)
        else:
            for _ in range(shape.num_gpu):
                gpus.remove(MILLI)
        return tuple(gpus), sig[1] - shape.cpu_milli, sig[2] - shape.mem_mib, sig[3]

    def delta(self, strategy: str, sig: Signature, shape: Shape, scarcity: int = 0) -> tuple[float, int]:
        """(how much placing ``shape`` raises the node's fragmentation, the free value of the GPU to use).

        Lower is better. For a fraction, every distinct free GPU value with room
        is tried; ``fgd`` quantises as the paper's simulator does.
        """
        key = (strategy, sig, shape, scarcity)
        found = self._delta.get(key)
        if found is not None:
            return found
        if len(self._delta) > CACHE_LIMIT:
            self._delta.clear()
        fgd = strategy == "fgd"
        before = self.fragmentation(sig, fgd, scarcity)
        best: tuple[float, int] | None = None
        if not shape.num_gpu:
            options = [0]
        elif shape.gpu_milli < MILLI:
            options = sorted({g for g in sig[0] if g >= shape.gpu_milli})
        else:
            options = [MILLI]
        for free in options:
            raised = self.fragmentation(self._after(sig, shape, free), fgd, scarcity) - before
            if strategy == "fgd":
                raised = -int(100 / (1 + math.exp(raised / MILLI)))
            if best is None or raised < best[0] - 1e-9:
                best = (raised, free)
        result = best if best is not None else (math.inf, 0)
        self._delta[key] = result
        return result

    # --- placement ----------------------------------------------------------------------------

    def candidates(self, strategy: str, request: TaskRequest, index: NodeIndex) -> Iterator[NodeState]:
        """Nodes that hold the task, least fragmentation added first (then the fullest node)."""
        if not request.uses_gpu:
            pool = index.with_free_cpus(request.cpus)
        elif request.is_shared:
            share = smallest_share(request, index)
            pool = chain((n for n, _ in index.shared_gpus(share, cpus=request.cpus)),
                         index.with_free_gpus(1, cpus=request.cpus))
        else:
            pool = index.with_free_gpus(request.whole_gpus, cpus=request.cpus)
        plain = request.gpu_memory_gib is None
        shape = shape_of(request) if plain else None
        fragaware = strategy == "fragaware"
        scarcity = self._scarcity_number(index) if fragaware else 0
        cpus, memory = request.cpus - EPS, request.memory_gib - EPS
        entries = self._sig
        raised_by: dict[int, float] = {}
        seen: set[NodeState] = set()
        scored = []
        # The hot loop of placement: node look-ups are inlined rather than called per node.
        for order, node in enumerate(pool):
            if node in seen or node.free_cpu < cpus or node.free_mem < memory:
                continue
            seen.add(node)
            entry = entries.get(node)
            if entry is None or entry[0] != node.version:
                entry = self._node_entry(node)
            sig = entry[1]
            if plain:
                raised = raised_by.get(id(sig))
                if raised is None:
                    assert shape is not None  # plain
                    raised = raised_by[id(sig)] = self.delta(strategy, sig, shape, scarcity)[0]
            else:
                raised = self.delta(strategy, sig, shape_of(request, None, node.gpu_memory_gib), scarcity)[0]
            if raised == math.inf:
                continue
            scored.append(((raised, entry[2], order) if fragaware else (raised, order), node))
        if not scored:
            return
        best = min(scored, key=_key)
        yield best[1]
        scored.sort(key=_key)
        for item in scored:
            if item is not best:
                yield item[1]

    def gpu_order(self, strategy: str, request: TaskRequest, node: NodeState) -> list[int]:
        """GPU indices for the task on ``node``: for a fraction, the GPU the score chose first."""
        free = node.free_share
        order = sorted(range(len(free)), key=lambda i: (free[i], i))
        if not request.is_shared:
            return order
        shape = shape_of(request, None, node.gpu_memory_gib)
        scarcity = self._pool_scarcity.get(node.pool, 0) if strategy == "fragaware" else 0
        _, chosen = self.delta(strategy, self.signature(node), shape, scarcity)
        first = [i for i in order if round(free[i] * MILLI) == chosen]
        return first + [i for i in order if i not in first]


def _could_host(node: NodeState, shape: Shape) -> bool:
    """Whether ``node``, empty, could hold one copy of ``shape``."""
    spec = node.spec
    return (spec.usable_gpus >= shape.num_gpu and spec.cpus * MILLI >= shape.cpu_milli
            and spec.memory_gib * 1024 >= shape.mem_mib and all(node.labels.get(k) == v for k, v in shape.selector))


def _key(item: tuple) -> tuple:
    return item[0]


def profile_of(shapes: Sequence[Shape], coverage: float = 1.0) -> tuple[tuple[Shape, float], ...]:
    """The most popular shapes of a workload that together make ``coverage`` of it, with their counts.

    GPU-less shapes are left out: they cannot strand a GPU by themselves.
    """
    counts: dict[Shape, int] = {}
    for shape in shapes:
        if shape.num_gpu or shape.gpu_milli:
            counts[shape] = counts.get(shape, 0) + 1
    ranked = sorted(counts.items(), key=lambda kv: (-kv[1], kv[0].num_gpu, kv[0].gpu_milli, kv[0].cpu_milli))
    total = sum(counts.values())
    out, covered = [], 0
    for shape, count in ranked:
        if covered >= coverage * total:
            break
        out.append((shape, float(count)))
        covered += count
    return tuple(out)


PLUGIN = FragAware()
