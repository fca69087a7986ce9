"""The victims of one list by the nodes they sit on: what they hold on each node, and which sit where."""

from __future__ import annotations

import bisect
from typing import Mapping, Sequence

from gpud.core.victim import Victim
from gpud.model import TaskPlacement

_NOTHING = (0.0, 0.0, 0.0)


class VictimsByNode:
    """The victims of one list (in victim order) by node, as their tasks sat when this was made.

    ``held`` sums up, by node, the GPUs, CPUs and memory the victims' tasks
    hold there. It stays true as "at least" while no victim of the list is
    placed anew: evictions only take tasks away, and a rollback, or a victim
    put back on its own GPUs, returns them where they were. For the same
    reason a victim's tasks sit only on nodes it is listed on here.
    """

    __slots__ = ("victims", "held", "_at", "_by_gpu", "_gpu_levels")

    def __init__(self, victims: list[Victim],
                 placements: Mapping[str, Sequence[TaskPlacement | None]]) -> None:
        self.victims = victims
        sums: dict[str, list[float]] = {}
        at: dict[str, list[int]] = {}  # by node: the positions in ``victims`` of those with a task there
        for i, victim in enumerate(victims):
            request = victim.job.request
            for placement in placements[victim.job.id]:
                if placement is None:
                    continue
                node = placement.node
                found = sums.get(node)
                if found is None:
                    found = sums[node] = [0.0, 0.0, 0.0]
                    at[node] = [i]
                elif at[node][-1] != i:
                    at[node].append(i)
                found[0] += placement.gpu_share * len(placement.gpu_index)
                found[1] += request.cpus
                found[2] += request.memory_gib
        self.held: dict[str, tuple[float, float, float]] = {node: (g, c, m) for node, (g, c, m) in sums.items()}
        self._at = at
        # The nodes by the GPUs their victims hold, fewest first, so those holding enough are a tail.
        self._by_gpu = sorted(self.held, key=self._gpus_held)
        self._gpu_levels = [self.held[node][0] for node in self._by_gpu]

    def _gpus_held(self, node: str) -> float:
        """The GPUs the victims hold on the node."""
        return self.held[node][0]

    def holds(self, node: str, gpu: float, cpu: float, mem: float) -> bool:
        """True when the victims on the node hold at least this many GPUs, CPUs and memory."""
        most = self.held.get(node, _NOTHING)
        return most[0] >= gpu and most[1] >= cpu and most[2] >= mem

    def nodes_holding(self, gpu: float, cpu: float, mem: float) -> list[str]:
        """Every node whose victims hold at least this many GPUs, CPUs and memory (``holds`` true)."""
        held = self.held
        found = []
        for node in self._by_gpu[bisect.bisect_left(self._gpu_levels, gpu):]:
            most = held[node]
            if most[1] >= cpu and most[2] >= mem:
                found.append(node)
        return found

    def sitting_on(self, nodes: list[str]) -> list[Victim]:
        """The victims with a task on one of the nodes when this was made, in victim order; each once."""
        at = self._at
        if len(nodes) == 1:
            positions = at[nodes[0]]
        else:
            positions = sorted({i for node in nodes for i in at[node]})
        victims = self.victims
        return [victims[i] for i in positions]
